"""`kvscope demo`: a recorded vLLM stream, real sockets, the collector, and what each reset did."""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import read_capture
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.recovery import Recovery, RecoveryTracker

CAPTURE = "lab_3rps_180s"
REPLICA = "lab-3rps"


def _bundled(name: str) -> Path:
    return Path(str(resources.files("kvscope") / "data" / name))


def run_demo(console: Console, speed: float = 0.0, timeout_s: float = 120.0) -> int:
    records = list(read_capture(_bundled(f"{CAPTURE}.msgpack.gz")))
    sidecar = json.loads(_bundled(f"{CAPTURE}.json").read_text())
    last_seq = records[-1].seq
    tracker = RecoveryTracker()
    source = CaptureSource(records, speed=speed)
    stream = StreamId(REPLICA, 0)
    collector = Collector(
        replica_streams(REPLICA, source.endpoint, source.replay_endpoint),
        listeners=[tracker],
        pre_apply=[tracker.before_batch],
    )
    console.print(
        f"[bold]kvscope demo[/]: {len(records)} batches recorded from vLLM "
        f"{sidecar['versions']['vllm']}'s scheduler ({sidecar['workload']['rate']} req/s, "
        f"{sidecar['scheduler']['num_gpu_blocks']} blocks), served on {source.endpoint} "
        f"(replay {source.replay_endpoint})"
    )
    try:
        with collector:
            deadline = time.monotonic() + 10
            while not collector.is_connected(stream) and time.monotonic() < deadline:
                time.sleep(0.01)
            source.play()
            ingest = collector.ingests[stream]
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                with collector.lock:
                    if ingest.last_seq == last_seq and not ingest.replaying:
                        break
                time.sleep(0.05)
            with collector.lock:
                counts = ingest.map.counts()
                totals = ingest.map.totals()
                counters = ingest.counters
                degraded = ingest.degraded
    finally:
        source.close()

    console.print(_resets_table(tracker, sidecar))
    truth = max(
        (s for s in sidecar["snapshots"] if s["pending_events"] == 0),
        key=lambda s: s["published_through_seq"],
    )
    exact = counts == {(h, g): n for h, g, n in truth["hashes"]}
    console.print(
        f"final map: {totals.blocks} blocks, {totals.hittable} hittable, {totals.orphans} orphans; "
        f"{counters.batches_applied} batches applied, {counters.gaps} gaps, "
        f"{counters.replays_ok} replays"
        + (f", [red]degraded: {degraded.reason}[/]" if degraded else "")
    )
    verdict = "[green]equals[/]" if exact else "[red]DIFFERS FROM[/]"
    console.print(
        f"the map {verdict} vLLM's BlockPool.cached_block_hash_to_block at seq "
        f"{truth['published_through_seq']} ({len(truth['hashes'])} hashes)"
    )
    console.print(
        "Not built yet: the SQLite store, the API and the page (`kvscope serve`); see the README."
    )
    return 0 if exact and degraded is None else 1


def _resets_table(tracker: RecoveryTracker, sidecar: dict[str, Any]) -> Table:
    modes = {r["cleared_in_seq"]: r["mode"] for r in sidecar["resets"] if "cleared_in_seq" in r}
    table = Table(title="what each reset did (blocks / hittable)")
    for column in ("seq", "mode", "before", "+1 s", "+10 s", "+60 s", "orphans +10 s"):
        table.add_column(column)
    for r in tracker.recoveries:

        def at(offset: float, r: Recovery = r) -> str:
            got = r.after.get(offset)
            return "-" if got is None else f"{got.blocks} / {got.hittable}"

        orphans = r.after.get(10.0)
        table.add_row(
            str(r.seq),
            str(modes.get(r.seq, r.reason)),
            f"{r.before_blocks} / {r.before_hittable}",
            at(1.0),
            at(10.0),
            at(60.0),
            "-" if orphans is None else str(orphans.orphans),
        )
    return table
