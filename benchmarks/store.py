"""What keeping history costs: ingest with the store on, bytes on disk, rebuilding an instant.

    python benchmarks/store.py [--events N] [--cached C] [--seed S] [--rebuilds R] [--no-postgres]
                               [--rounds N] [--big-cached B] [--log-chunk-format F]
                               [--checkpoint-events-per-block K] [--checkpoint-delta-share S]

One run prints, each beside its baseline measured in the same run (targets are reported, never
asserted):
1. memory-only ingest (block-events/s of `StreamIngest.live_frames` over pre-encoded payloads:
   the baseline), then the same with the store on (SQLite file; PostgreSQL), timed until the
   writer has committed the last row; their ratio (targets: SQLite >= 0.6x, PostgreSQL >= 0.5x),
   the median over `--rounds` rounds of the three run back to back (the writer's idle work,
   storage/log_repack.py's re-packing, done only while it waits for rows: what was left of it
   after the last row is said apart, and done before the disk is measured); and each kind's CPU
   seconds
   per second (a memory-only run well under one shared the machine: its ratios are not an idle
   machine's, where the writer's GIL-held work cannot overlap the ingest thread's); and per
   database a `time_split_s` line: the ingest loop's wall and CPU seconds, the wait for the
   writer after it, the writer thread's CPU seconds and its wall seconds in transactions,
   beside the memory-only loop's, and which thread bounds the store's share; and each thread's
   wall past its CPU split (Linux's per-thread counts, benchmarks/_thread_clock.py) into the
   wait for a core (the machine's other load) and the time blocked (the GIL; the writer also
   the disk and its takes), with how many times it blocked;
2. bytes on disk per block-event (the SQLite file after the run and the writer's idle work, WAL
   checkpointed; and less its free pages, which the rows that follow would take), split into
   the log, checkpoints and the rest, with the log's batches packed in each chunk format (today's
   layout beside the new one), on the benchmark stream and on the bundled lab recordings; and
   what that comes to per replica-day at an H200's rate and for a fleet's week (target: <= 20);
3. the time to rebuild a replica of about 100k cached blocks at random instants (checkpoint plus
   log, as `kvscope dump` does): median and p90 (target: median <= 50 ms at 100k blocks); with
   `--big-cached 1000000`, the same for a replica of that many blocks, stored on its own (its
   stream is 4x as many block-events; target: median <= 300 ms at 1M blocks).
The last line is one JSON object with those figures.

The stream is benchmarks/ingest.py's model of vLLM 0.33's BlockPool (see there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import create_engine, text

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.log_chunks import SETTABLE_FORMATS
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.write_loop import WRITER_THREAD
from kvscope.storage.writer import StoreWriter
from kvscope.storage.writer_state import WriterStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream
from _pg import database_url, fresh_database
from _store_disk import measure, projection, recordings, stream_log
from _thread_clock import ThreadClock, thread_clock

STREAM = StreamId("bench", 0)


def frames_of(payloads: list[bytes]) -> list[list[bytes]]:
    return [[b"", seq.to_bytes(8, "big"), p] for seq, p in enumerate(payloads)]


class TimeSplit(NamedTuple):
    """Where a run's seconds went: which thread bounds the store's share of ingest, and what
    each thread's wall was besides its CPU (benchmarks/_thread_clock.py): waiting for a core
    (the machine's other load) or blocked (the GIL; the writer also on the disk and its takes)."""

    loop_wall: float
    """The ingest loop, on its thread."""
    loop_cpu: float
    """The ingest thread's CPU seconds in the loop."""
    writer_wait: float
    """After the loop: the wait for the writer to commit the rest (`flush`, `close`)."""
    writer_cpu: float
    """The writer thread's CPU seconds."""
    writer_in_transactions: float
    """The writer's wall seconds inside its transactions."""
    loop_run_queue: float = 0.0
    """The ingest thread's seconds in the loop ready to run, waiting for a core."""
    loop_blocked: float = 0.0
    """The ingest thread's seconds in the loop blocked: waiting for the GIL."""
    loop_waits: int = 0
    """The times it blocked."""
    writer_run_queue: float = 0.0
    """The writer thread's seconds in the run ready to run, waiting for a core."""
    writer_blocked: float = 0.0
    """The writer thread's seconds in the run blocked: the GIL, the disk, its takes' waits."""
    writer_waits: int = 0
    """The times it blocked."""
    idle_chunks_during: float = 0.0
    """Chunks the writer re-packed in idle time (storage/log_repack.py) while rows came, as it
    waited for them (and within a step or two after the last row's commit, counted here too)."""
    idle_cpu_during: float = 0.0
    """Their CPU seconds (of `writer_cpu`)."""
    idle_chunks_after: float = 0.0
    """The chunks left to re-pack after the last row, before the disk is measured."""
    idle_cpu_after: float = 0.0
    """Their CPU seconds (not in `writer_cpu`)."""
    idle_wall_after: float = 0.0
    """The wall seconds they took (not in the rate)."""

    def bound_by(self) -> str:
        """The thread that worked the longer: with the GIL between them, the other waited."""
        return "writer" if self.writer_cpu > self.loop_cpu else "ingest"

    def line(self, what: str, memory_only: TimeSplit) -> str:
        return (
            f"time_split_s {what}: ingest loop {self.loop_wall:.2f} wall = {self.loop_cpu:.2f} "
            f"CPU + {self.loop_run_queue:.2f} waiting for a core + {self.loop_blocked:.2f} "
            f"blocked ({self.loop_waits:.0f} times), then {self.writer_wait:.2f} waiting for "
            f"the writer; writer {self.writer_cpu:.2f} CPU + {self.writer_run_queue:.2f} "
            f"waiting for a core + {self.writer_blocked:.2f} blocked ({self.writer_waits:.0f} "
            f"times), {self.writer_in_transactions:.2f} wall in transactions; memory-only loop "
            f"{memory_only.loop_wall:.2f} wall = {memory_only.loop_cpu:.2f} CPU + "
            f"{memory_only.loop_run_queue:.2f} waiting for a core "
            f"(bound by the {self.bound_by()} thread); idle re-packing "
            f"{self.idle_chunks_during:.0f} chunks ({self.idle_cpu_during:.2f} CPU) while rows "
            f"came, {self.idle_chunks_after:.0f} ({self.idle_cpu_after:.2f} CPU, "
            f"{self.idle_wall_after:.2f} wall) after the last row"
        )

    @staticmethod
    def median(splits: list[TimeSplit]) -> TimeSplit:
        return TimeSplit(*(statistics.median(f) for f in zip(*splits, strict=True)))


NO_CLOCK = ThreadClock(math.nan, math.nan, 0)
"""Where Linux's per-thread counts are not to be had."""


def clock_of(thread: threading.Thread | None) -> ThreadClock:
    if thread is None or thread.native_id is None:
        return ThreadClock(0.0, 0.0, 0)
    return thread_clock(thread.native_id) or NO_CLOCK


def writer_thread() -> threading.Thread:
    """The store writer's thread (the benchmark runs one store at a time)."""
    (found,) = [t for t in threading.enumerate() if t.name == WRITER_THREAD]
    return found


def ingest_rate(
    frames: list[list[bytes]],
    block_events: int,
    writer: StoreWriter | None,
    busy: list[float] | None = None,
    splits: list[TimeSplit] | None = None,
) -> float:
    """Block-events per second, until the last row is committed; with `busy`, the run's CPU
    seconds (this process, all threads) per second appended to it; with `splits`, its
    `TimeSplit`. The writer's idle work is waited for after (the store as compact as it gets)."""
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    this_thread = threading.current_thread()
    other = writer_thread() if writer is not None else None
    clocks = clock_of(this_thread), clock_of(other)
    started, cpu = time.perf_counter(), time.process_time()
    thread_cpu = time.thread_time()
    for frame in frames:
        ingest.live_frames(frame, time.time())
    looped, loop_cpu = time.perf_counter(), time.thread_time() - thread_cpu
    loop_clock = clock_of(this_thread) - clocks[0]
    writer_clock, writer_read = ThreadClock(0.0, 0.0, 0), looped
    stats = writer.stats if writer is not None else WriterStats()
    if writer is not None:
        # The rows are only kept once committed; the writer thread read before it ends.
        assert writer.flush(600), "the writer stopped"
        writer_clock = clock_of(other) - clocks[1]
        writer_read = time.perf_counter()
    ended = time.perf_counter()
    process_cpu = time.process_time() - cpu
    at_last_row = dataclasses.replace(stats)
    if writer is not None:
        assert writer.flush(600, idle_work=True), "the writer stopped"
        writer.close(600)
        assert writer.stats.batches_dropped == 0, "the store fell behind: raise queue_rows"
    idle_wall_after = time.perf_counter() - ended
    elapsed = ended - started
    if busy is not None:
        busy.append(process_cpu / elapsed)
    if splits is not None:
        splits.append(
            TimeSplit(
                looped - started,
                loop_cpu,
                ended - looped,
                at_last_row.writer_cpu_seconds_total,
                at_last_row.write_seconds_total,
                loop_clock.run_queue,
                looped - started - loop_cpu - loop_clock.run_queue,
                loop_clock.waits,
                writer_clock.run_queue,
                writer_clock.blocked(writer_read - started) if writer is not None else 0.0,
                writer_clock.waits,
                at_last_row.idle_chunks,
                at_last_row.idle_cpu_seconds_total,
                stats.idle_chunks - at_last_row.idle_chunks,
                stats.idle_cpu_seconds_total - at_last_row.idle_cpu_seconds_total,
                idle_wall_after if writer is not None else 0.0,
            )
        )
    assert ingest.counters.batches_applied == len(frames) and ingest.degraded is None
    return block_events / elapsed


def settings(args: argparse.Namespace) -> StoreSettings:
    """The store's settings under test (the disk trades as the flags say), with room for the
    whole run: this measures throughput, not the overflow policy."""
    return StoreSettings(
        queue_rows=10_000_000,
        checkpoint_delta_share=args.checkpoint_delta_share,
        checkpoint_events_per_block=args.checkpoint_events_per_block,
        log_chunk_format=args.log_chunk_format,
    )


class Rebuilds(NamedTuple):
    times: list[float]
    replayed: list[int]
    """Batches replayed after the checkpoint: what a rebuild's time follows, whatever the load
    (the same on every run of a stream and settings: checkpoints are paced by the stream)."""

    def line(self, what: str, target_ms: float, at_target_size: bool) -> str:
        median_ms, p90_ms = _median_p90_ms(self.times)
        mark = _mark(median_ms <= target_ms) if at_target_size else "smaller than the target case"
        return (
            f"rebuild a {what} replica at random instants: median {median_ms:.1f} ms, "
            f"p90 {p90_ms:.1f} ms, {statistics.median(self.replayed):,.0f} batches replayed "
            f"(median)  (target median <= {target_ms:.0f} ms: {mark})"
        )


def big_rebuild_times(args: argparse.Namespace) -> Rebuilds:
    """A replica of `cached` blocks stored on its own (SQLite), rebuilt at random instants."""
    cached, rounds, seed = args.big_cached, args.rebuilds, args.seed
    payloads, stats = make_stream(4 * cached, seed, cached, 10**12)
    print(
        f"big stream: {stats.block_events:,} block-events in {len(payloads):,} batches, "
        f"{stats.final_cached:,} blocks cached at the end"
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'big.sqlite'}"
        ingest_rate(
            frames_of(payloads), stats.block_events, StoreWriter(open_store(url), settings(args))
        )
        with create_engine(url).connect() as conn:
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
            sizes = conn.execute(
                text("SELECT count(*), sum(length(snapshot)) FROM checkpoints")
            ).one()
        total = sum(f.stat().st_size for f in Path(tmp).iterdir())
        print(
            f"  disk: {total / stats.block_events:.1f} bytes per block-event, of which "
            f"{sizes[1] / stats.block_events:.1f} in {sizes[0]} checkpoints"
        )
        return rebuild_times(url, len(payloads), rounds, seed)


def _mark(met: bool) -> str:
    return "met" if met else "NOT met"


def _median_p90_ms(times: list[float]) -> tuple[float, float]:
    # The nearest-rank p90: never below the median, however few the times.
    p90 = sorted(times)[math.ceil(0.9 * len(times)) - 1]
    return statistics.median(times) * 1000, p90 * 1000


def rebuild_times(url: str, batches: int, rounds: int, seed: int) -> Rebuilds:
    engine = open_store(url)
    rng = random.Random(seed)
    times, replayed = [], []
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        for _ in range(rounds):
            seq = rng.randrange(batches // 2, batches)  # once the cache is full
            started = time.perf_counter()
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            times.append(time.perf_counter() - started)
            replayed.append(rebuilt.batches_replayed)
            assert rebuilt.map.totals().blocks > 0
    return Rebuilds(times, replayed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="block-events to ingest")
    parser.add_argument("--cached", type=int, default=100_000, help="cached blocks when full")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rebuilds", type=int, default=30)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="ingest runs of each kind")
    parser.add_argument(
        "--big-cached", type=int, default=0, help="also rebuild a replica of this many blocks"
    )
    parser.add_argument(
        "--checkpoint-delta-share",
        type=float,
        default=StoreSettings.checkpoint_delta_share,
        help="the store setting of that name (1.0: delta checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-events-per-block",
        type=float,
        default=StoreSettings.checkpoint_events_per_block,
        help="the store setting of that name (lower: faster rebuilds, more checkpoint bytes)",
    )
    parser.add_argument(
        "--log-chunk-format",
        type=int,
        choices=SETTABLE_FORMATS,
        default=StoreSettings.log_chunk_format,
        help="the store setting of that name (3: the columnar log)",
    )
    args = parser.parse_args()
    print(
        f"store settings: checkpoint_delta_share = {args.checkpoint_delta_share}, "
        f"checkpoint_events_per_block = {args.checkpoint_events_per_block}, "
        f"log_chunk_format = {args.log_chunk_format}"
    )

    payloads, stats = make_stream(args.events, args.seed, args.cached, 10**12)
    frames = frames_of(payloads)
    block_events = stats.block_events
    print(
        f"stream: {block_events:,} block-events in {len(frames):,} batches, "
        f"{stats.final_cached:,} blocks cached at the end"
    )

    # Rounds of baseline, SQLite, PostgreSQL back to back: on a shared machine the load moves
    # between runs, and each round's ratios compare runs made close together.
    rates: dict[str, list[float]] = {"baseline": [], "sqlite": [], "postgres": []}
    busy: dict[str, list[float]] = {kind: [] for kind in rates}
    splits: dict[str, list[TimeSplit]] = {kind: [] for kind in rates}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            rates["baseline"].append(
                ingest_rate(frames, block_events, None, busy["baseline"], splits["baseline"])
            )
            folder = Path(tmp) / f"round{round_}"
            folder.mkdir()
            url = f"sqlite:///{folder / 'bench.sqlite'}"
            writer = StoreWriter(open_store(url), settings(args))
            rates["sqlite"].append(
                ingest_rate(frames, block_events, writer, busy["sqlite"], splits["sqlite"])
            )
            if not args.no_postgres:
                with fresh_database("kvscope_bench_") as name:
                    pg_engine = open_store(database_url(name))
                    writer = StoreWriter(pg_engine, settings(args))
                    rates["postgres"].append(
                        ingest_rate(
                            frames, block_events, writer, busy["postgres"], splits["postgres"]
                        )
                    )
                    pg_engine.dispose()
        with create_engine(url).connect() as conn:
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        disk = measure(folder, block_events, stream_log(STREAM, payloads))
        times = rebuild_times(url, len(frames), args.rebuilds, args.seed)
    baseline = statistics.median(rates["baseline"])
    print(
        f"baseline: memory-only ingest            {baseline:12,.0f} block-events/s  "
        f"(median of {args.rounds} rounds)"
    )
    ratios = {}
    for kind, what, target in (("sqlite", "SQLite file", 0.6), ("postgres", "PostgreSQL", 0.5)):
        if not rates[kind]:
            continue
        each = [rate / base for rate, base in zip(rates[kind], rates["baseline"], strict=True)]
        ratios[kind] = statistics.median(each)
        print(
            f"store on, {what:<30} {statistics.median(rates[kind]):12,.0f} block-events/s  "
            f"{ratios[kind]:.2f}x the baseline, median of rounds "
            f"({', '.join(f'{r:.2f}' for r in each)})  "
            f"(target >= {target}x: {_mark(ratios[kind] >= target)})"
        )
    # On two cores an idle machine gives the memory-only run about one CPU second per second
    # and a store-on run more (its writer thread): far less, and the runs shared the cores with
    # other work, and the ratios above are not an idle machine's.
    cpu_per_s = {kind: round(statistics.median(b), 2) for kind, b in busy.items() if b}
    print(
        "CPU seconds per second of the ingest runs (this process, all threads; medians): "
        + ", ".join(f"{kind} {share:.2f}" for kind, share in cpu_per_s.items())
    )
    time_split = {kind: TimeSplit.median(each) for kind, each in splits.items() if each}
    for kind in ("sqlite", "postgres"):
        if kind in time_split:
            print(time_split[kind].line(kind, time_split["baseline"]))
    sqlite_rate = statistics.median(rates["sqlite"])
    pg_rate = statistics.median(rates["postgres"]) if rates["postgres"] else None

    per_event = disk.per_event(disk.file_bytes)
    for line in disk.lines("benchmark stream (SQLite)"):
        print(line)
    print(f"  payloads alone: {stats.payload_bytes / block_events:.1f} bytes per block-event")
    print(f"  projection: {projection(per_event)}")
    recorded = recordings(settings(args))
    for name, rec in recorded:
        for line in rec.lines(f"recording {name}"):
            print(line)
        print(f"  projection: {projection(rec.per_event(rec.file_bytes))}")
    median_ms, p90_ms = _median_p90_ms(times.times)
    print(times.line(f"~{args.cached // 1000}k-block", 50, args.cached >= 100_000))
    big_median_ms = None
    if args.big_cached:
        big = big_rebuild_times(args)
        big_median_ms = _median_p90_ms(big.times)[0]
        print(big.line(f"~{args.big_cached // 1000}k-block", 300, args.big_cached >= 1_000_000))
    print(
        json.dumps(
            {
                "baseline_block_events_per_s": round(baseline),
                "sqlite_block_events_per_s": round(sqlite_rate),
                "sqlite_ratio": round(ratios["sqlite"], 3),
                "postgres_block_events_per_s": None if pg_rate is None else round(pg_rate),
                "postgres_ratio": None if pg_rate is None else round(ratios["postgres"], 3),
                "cpu_per_s": cpu_per_s,
                "time_split_s": {
                    kind: {
                        **{k: round(v, 3) for k, v in split._asdict().items()},
                        "bound_by": split.bound_by(),
                    }
                    for kind, split in time_split.items()
                },
                "disk_bytes_per_block_event": round(per_event, 1),
                "disk_in_use_bytes_per_block_event": round(
                    disk.per_event(disk.file_bytes - disk.free_bytes), 1
                ),
                "log_bytes_per_block_event": {
                    fmt: round(disk.per_event(size), 1) for fmt, size in disk.log_by_format.items()
                },
                "recordings_disk_bytes_per_block_event": {
                    name: round(rec.per_event(rec.file_bytes), 1) for name, rec in recorded
                },
                "content_floor_bytes_per_block_event": {
                    "stream": round(disk.floor.per_event(), 1),
                    **{name: round(rec.floor.per_event(), 1) for name, rec in recorded},
                },
                "rebuild_median_ms": round(median_ms, 1),
                "rebuild_p90_ms": round(p90_ms, 1),
                "big_rebuild_median_ms": None if big_median_ms is None else round(big_median_ms, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
