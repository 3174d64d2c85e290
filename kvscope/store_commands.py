"""The store's side of the command line: `--store`, and `dump`, `resets`, `db upgrade`."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from kvscope.collector.dump import map_lines
from kvscope.collector.types import StreamId
from kvscope.config import StoreConfig
from kvscope.options import JsonOpt
from kvscope.storage import schema
from kvscope.storage.backfill import backfill
from kvscope.storage.engine import DEFAULT_STORE as _DEFAULT_STORE
from kvscope.storage.engine import StoreError, open_store
from kvscope.storage.history import (
    NotInStore,
    position_at_seq,
    position_at_time,
    rebuild,
    stream_id,
)
from kvscope.storage.leases import Fence, LeaseError, check_backend
from kvscope.storage.redact import redact
from kvscope.storage.reset_links import LINK_WINDOW_S, linked_modes, resets_query
from kvscope.storage.retention import DAY, Pruner, Retention, prune
from kvscope.storage.scrape import MetricsScraper
from kvscope.storage.shards import ShardConflict, claim_streams
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from kvscope.tables import TableData, show_table

DEFAULT_STORE = _DEFAULT_STORE
NO_STORE = "none"
StoreOption = Annotated[
    str,
    typer.Option(
        envvar="KVSCOPE_STORE",
        help="SQLAlchemy URL of the store: sqlite:///FILE (WAL; the default) or "
        "postgresql+psycopg://USER@HOST/DB; 'none' keeps nothing.",
    ),
]
StoreFlag = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="KVSCOPE_STORE",
        help="SQLAlchemy URL of the store: sqlite:///FILE (WAL) or "
        "postgresql+psycopg://USER@HOST/DB; 'none' keeps nothing. Default: [store] url in "
        f"--config, else {DEFAULT_STORE}.",
        show_default=False,
    ),
]
"""--store of the commands that also read a --config file (which may name the store)."""
SpillBytesOpt = Annotated[
    int | None,
    typer.Option(
        envvar="KVSCOPE_SPILL_BYTES",
        min=0,
        help="While the store is down, rows its queue cannot hold wait in a local file up to "
        "this size, in order; only past it are batches dropped. 0: no spill. Default: "
        f"[store] spill_bytes, else {StoreSettings.spill_bytes}.",
        show_default=False,
    ),
]
LogDictionaryBytesOpt = Annotated[
    int | None,
    typer.Option(
        envvar="KVSCOPE_LOG_DICTIONARY_BYTES",
        min=0,
        help="Token content each stream keeps to compress its log against; a collector of "
        "hundreds of streams may lower it. 0: the log compressed without. Default: [store] "
        f"log_dictionary_bytes, else {StoreSettings.log_dictionary_bytes}.",
        show_default=False,
    ),
]
SpillDirOpt = Annotated[
    str | None,
    typer.Option(
        envvar="KVSCOPE_SPILL_DIR",
        help="Folder of that file (anonymous, removed at exit). Default: [store] spill_dir, else "
        "the system's temp.",
    ),
]
console = Console()
err = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}")
    return typer.Exit(2)


def open_for_reading(url: str) -> Engine:
    """The store at `url` for a command that only reads it: never migrated or created, opened
    read-only where this process may not write it; a store that cannot be read is one line."""
    try:
        return open_store(url, read_only=True)
    except StoreError as exc:
        raise _fail(redact(f"{url}: {exc}")) from exc


def open_writer(
    store: StoreConfig, streams: Sequence[StreamId] = (), fence: Fence | None = None
) -> StoreWriter | None:
    """A writer on `store` owning `streams` (refused if another shard writes one of them);
    with a `fence` (leases), writing only the streams whose lease it holds."""
    url = store.url
    if url == NO_STORE:
        return None
    try:
        engine = open_store(url)
        claim_streams(engine, list(streams), store.shard)
        settings = StoreSettings(
            shard=store.shard,
            spill_bytes=store.spill_bytes,
            spill_dir=store.spill_dir,
            log_dictionary_bytes=store.log_dictionary_bytes,
            checkpoint_delta_share=store.checkpoint_delta_share,
            log_chunk_format=store.log_chunk_format,
        )
        if fence is not None:
            check_backend(engine.dialect.name)
        return StoreWriter(engine, settings, fence)
    except (ShardConflict, LeaseError) as exc:
        raise _fail(str(exc)) from exc
    except SQLAlchemyError as exc:
        raise _fail(redact(f"cannot open store {url}: {str(exc).splitlines()[0]}")) from exc


@contextmanager
def scraping(writer: StoreWriter | None, targets: dict[str, str]) -> Iterator[None]:
    """Scrape each replica's vLLM /metrics into the store while the block runs."""
    if writer is None or not targets:
        yield
        return
    scraper = MetricsScraper(writer.engine, targets)
    scraper.start()
    try:
        yield
    finally:
        scraper.stop()


@contextmanager
def closing_writer(
    writer: StoreWriter | None, retention: Retention | None = None
) -> Iterator[None]:
    """Close (flush) the writer on the way out; prune in the background meanwhile."""
    pruner = None
    if writer is not None and retention is not None:
        pruner = Pruner(writer.engine, retention)
        pruner.start()
    try:
        yield
    finally:
        if pruner is not None:
            pruner.stop()
        if writer is not None:
            writer.close()
            if writer.stats.batches_dropped:
                err.print(
                    f"[yellow]store: {writer.stats.batches_dropped} batches dropped "
                    "(marked incomplete in the store)[/]"
                )


def parse_instant(text: str) -> float:
    """Unix seconds from `1700000000.5` or an ISO-8601 time (UTC when no zone is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise _fail(f"--at {text!r}: expected Unix seconds or an ISO-8601 time") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def dump(
    replica: Annotated[str, typer.Option(help="Replica name.")],
    store: StoreOption = DEFAULT_STORE,
    rank: Annotated[int, typer.Option(help="Data-parallel rank.")] = 0,
    seq: Annotated[int | None, typer.Option(help="The map after batch SEQ.")] = None,
    epoch: Annotated[
        int | None, typer.Option(help="With --seq: which epoch (default: the latest with it).")
    ] = None,
    at: Annotated[
        str | None, typer.Option(help="The map at this instant (Unix seconds or ISO-8601).")
    ] = None,
) -> None:
    """Print a stored map, after a seq or at an instant, as jsonl (one line per block)."""
    if (seq is None) == (at is None):
        raise _fail("give exactly one of --seq and --at")
    engine = open_for_reading(store)
    try:
        with engine.connect() as conn:
            sid = stream_id(conn, replica, rank)
            if seq is not None:
                position = position_at_seq(conn, sid, seq, epoch)
            else:
                assert at is not None
                position = position_at_time(conn, sid, parse_instant(at))
            rebuilt = rebuild(conn, position, StreamId(replica, rank))
    except NotInStore as exc:
        raise _fail(str(exc)) from exc
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    for line in map_lines(rebuilt.map):
        out.write(encoder.encode(line) + b"\n")
    out.flush()
    p = rebuilt.position
    err.print(
        f"{replica}/dp{rank} epoch {p.epoch} seq {p.seq} (ts {p.ts:.3f}): "
        f"{rebuilt.map.totals().blocks} blocks"
    )
    for reason in rebuilt.unknown_because:
        err.print(f"[yellow]warning: the map may be incomplete here: {reason}[/]")


def resets(
    store: StoreOption = DEFAULT_STORE,
    replica: Annotated[str | None, typer.Option(help="Only this replica.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the stored resets with their before and recovery."""
    engine = open_for_reading(store)
    r, s, rr = schema.resets, schema.streams, schema.reset_recovery
    query = resets_query().order_by(r.c.ts)
    if replica is not None:
        query = query.where(s.c.replica == replica)
    offsets = (1.0, 10.0, 60.0)
    table = TableData(
        "resets (blocks/hittable; 50 %, 90 %: seconds to that share of the blocks before)",
        [
            "id",
            "time (UTC)",
            "replica",
            "why",
            "mode",
            "before",
            *(f"+{o:g} s" for o in offsets),
            "50 %",
            "90 %",
            "recovery",
        ],
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
        # The store keeps no mode with a clear: it is the linked request's, as GET /resets says.
        modes = linked_modes(conn, rows, LINK_WINDOW_S)
        points: dict[int, dict[float, Any]] = {}
        for p in conn.execute(select(rr)):
            points.setdefault(p.reset_id, {})[p.offset_s] = p
    for row in rows:
        reached = points.get(row.id, {})
        at = [reached.get(offset) for offset in offsets]
        complete = bool(row.recovery_complete)
        offsets_reached = sorted(reached)
        table.add(
            [
                str(row.id),
                datetime.fromtimestamp(row.ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S"),
                f"{row.replica}/dp{row.rank}",
                "clear" if row.reason == "all_blocks_cleared" else row.reason,
                modes[row.id] or "-",
                f"{row.before_blocks}/{row.before_hittable}",
                *("-" if p is None else f"{p.blocks}/{p.hittable}" for p in at),
                *("-" if t is None else f"{t:.1f}" for t in (row.t50_s, row.t90_s)),
                _window(complete, offsets_reached),
            ],
            {
                "id": row.id,
                "ts": row.ts,
                "replica": row.replica,
                "rank": row.rank,
                "reason": row.reason,
                "mode": modes[row.id],
                "before_blocks": row.before_blocks,
                "before_hittable": row.before_hittable,
                "recovery": [
                    {"offset_s": o, "blocks": p.blocks, "hittable": p.hittable}
                    for o, p in zip(offsets, at, strict=True)
                    if p is not None
                ],
                "t50_s": row.t50_s,
                "t90_s": row.t90_s,
                "recovery_complete": complete,
                "offsets_reached": offsets_reached,
                "recovery_until_ts": row.recovery_until_ts,
            },
        )
    show_table(console, table, as_json)


def _window(complete: bool, offsets_reached: list[float]) -> str:
    """The recovery window as stored: complete, or partial (still followed, or cut short by a
    later reset or the stream's end) with the last offset reached."""
    if complete:
        return "complete"
    if not offsets_reached:
        return "partial, none yet"
    return f"partial to +{offsets_reached[-1]:g} s"


db_app = typer.Typer(help="The store's schema.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    store: StoreOption = DEFAULT_STORE,
    fill: Annotated[
        bool, typer.Option("--backfill/--no-backfill", help="Then run `kvscope db backfill`.")
    ] = True,
) -> None:
    """Create or migrate the store's tables to the current schema, then give resets stored
    by an older kvscope what the newer tables hold (`kvscope db backfill`)."""
    try:
        engine = open_store(store)
    except SQLAlchemyError as exc:
        raise _fail(redact(f"cannot migrate {store}: {str(exc).splitlines()[0]}")) from exc
    console.print(f"{redact(store)}: schema up to date")
    if fill:
        _backfill(engine)


@db_app.command("backfill")
def db_backfill(store: StoreOption = DEFAULT_STORE) -> None:
    """Compute the prefix groups, tokens recomputed and orphans left of resets stored before
    they were (migrations 0008, 0009), from their `before` map and the batch log."""
    _backfill(open_store(store))


def _backfill(engine: Engine) -> None:
    done = backfill(engine)
    console.print(
        f"backfilled {done.resets} resets ({done.groups} prefix groups), {done.chunks} log chunks"
        + (f"; {done.log_gone} left without: their batch log was pruned" if done.log_gone else "")
        + (
            f"; {done.answered_meanwhile} answered by a live writer meanwhile"
            if done.answered_meanwhile
            else ""
        )
    )


def _days(value: float | None) -> float | None:
    return None if value is None or value <= 0 else value * DAY


def prune_command(
    store: StoreOption = DEFAULT_STORE,
    log_days: Annotated[
        float,
        typer.Option(help="Keep the batch log (instants that rebuild) this long; 0: forever."),
    ] = 7.0,
    checkpoint_days: Annotated[float, typer.Option(help="Keep checkpoints; 0: forever.")] = 7.0,
    rollup_days: Annotated[
        float, typer.Option(help="Keep per-second rollups and engine samples; 0: forever.")
    ] = 30.0,
    reset_days: Annotated[float, typer.Option(help="Keep resets; 0 (default): forever.")] = 0.0,
    lease_grant_days: Annotated[
        float,
        typer.Option(help="Keep lease grants (--lease: who wrote each stream when); 0: forever."),
    ] = 7.0,
) -> None:
    """Apply retention now (`collect` also prunes in the background)."""
    retention = Retention(
        _days(log_days),
        _days(checkpoint_days),
        _days(rollup_days),
        _days(reset_days),
        _days(lease_grant_days),
    )
    pruned = prune(open_store(store), retention, time.time())
    console.print(
        f"pruned {pruned.batches} batches, {pruned.checkpoints} checkpoints, "
        f"{pruned.rollups} rollups, {pruned.engine_samples} engine samples, "
        f"{pruned.resets} resets, {pruned.lease_grants} lease grants"
    )


def register(app: typer.Typer) -> None:
    app.command()(dump)
    app.command()(resets)
    app.command("prune")(prune_command)
    app.add_typer(db_app, name="db")
