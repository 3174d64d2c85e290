"""What `collect` prints: the live table of its streams."""

from __future__ import annotations

import time

from rich.table import Table

from kvscope.collector.subscriber import Collector


def _tiers(tables: dict[str, tuple[int, int, int]]) -> str:
    return " ".join(f"{k}:{v[0]}" for k, v in sorted(tables.items())) or "-"


def stream_table(collector: Collector) -> Table:
    table = Table(title="kvscope collector", expand=False)
    for column in (
        "replica",
        "rank",
        "connected",
        "epoch",
        "last seq",
        "blocks by tier",
        "hittable",
        "orphans",
        "gaps",
        "replays ok/failed",
        "malformed",
        "state",
    ):
        table.add_column(column)
    now = time.time()
    with collector.lock:
        for stream, ingest in collector.ingests.items():
            stats = ingest.map.stats()
            totals = ingest.map.totals()
            c = ingest.counters
            tiers: dict[str, tuple[int, int, int]] = {}
            for key, s in stats.items():
                name = key.medium if key.group == 0 else f"{key.medium}/g{key.group}"
                tiers[name] = (s.blocks, s.hittable, s.orphans)
            if collector.is_gone(stream):
                state = "[dim]gone[/]"  # a fleet's publisher, silent past gone_after_s
            elif ingest.degraded is not None:
                state = f"[red]degraded[/] ({ingest.degraded.reason})"
            elif ingest.replaying:
                state = "[yellow]replaying[/]"
            elif collector.is_silent(stream, now) or ingest.tail_unverified(now):
                silent = ingest.silent_for(now)
                state = "silent" + ("" if silent is None else f" {silent:.0f}s")
                if ingest.tail_unverified(now):
                    state += ", tail unverified"
            else:
                state = "[green]live[/]"
            table.add_row(
                stream.replica,
                str(stream.rank),
                "yes" if collector.is_connected(stream) else "[red]no[/]",
                str(ingest.epoch),
                "-" if ingest.last_seq is None else str(ingest.last_seq),
                _tiers(tiers),
                str(totals.hittable),
                str(totals.orphans),
                str(c.gaps),
                f"{c.replays_ok}/{c.replays_failed}",
                str(sum(c.malformed.values()) + sum(c.ingest_errors.values())),
                state,
            )
    return table
