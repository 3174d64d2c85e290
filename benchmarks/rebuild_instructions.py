"""What replaying the log costs a rebuild, in instructions counted by callgrind: a figure that
holds still on a shared machine, where timings do not.

    python benchmarks/rebuild_instructions.py [--events N] [--cached C] [--seed S]
                                              [--rebuilds R] [--formats 2,4] [--stores DIR]
                                              [--timed K] [--annotate]

The stream (benchmarks/ingest.py's model) is stored once per log chunk format in SQLite, with
the store's default settings but for the format (outside valgrind; with `--stores DIR`, kept
there and reused by later runs, so that two builds count the very same stores). Then `R` fixed
instants (seeded, once the cache is full) are rebuilt under valgrind's callgrind, counting only
the rebuild loop: the whole rebuild and, inside it, the replay (`collector/_replay.pyx`'s
`replay`, with the log's chunks it opens as it goes). It prints instructions per replayed batch
and per replayed block-event (the stream's mean block-events per batch), for each format; with
`--timed K`, also the median wall time of a rebuild over K rounds of the same instants (noisy on
a shared machine). Run it under another build's PYTHONPATH with the same `--stores` for a
baseline. Needs valgrind.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from _callgrind import annotated, count, run_child, store_stream
from sqlalchemy import create_engine, text

from kvscope.collector import _replay as replay_module
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

STREAM = StreamId("bench", 0)
REPLAY = "__pyx_pw_7kvscope_9collector_7_replay_1replay"
"""The compiled `replay`'s entry, whose inclusive cost is the replay's (the log's chunks read
as it goes included)."""
FUSED = "__pyx_f_7kvscope_9collector_7_replay_10FusedApply_fused"
"""Its batches' checks and table writes, without reading the log."""


def store(path: Path, payloads: list[bytes], fmt: int) -> None:
    """The stream, ingested into a SQLite store at `path` writing log chunk format `fmt`."""
    writer = StoreWriter(
        open_store(f"sqlite:///{path}"), StoreSettings(queue_rows=10**8, log_chunk_format=fmt)
    )
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for seq, payload in enumerate(payloads):
        ingest.live_frames([b"", seq.to_bytes(8, "big"), payload], 1_796_051_000.0 + 0.001 * seq)
    writer.close(600)
    assert writer.stats.batches_dropped == 0
    # The log into the file itself: read through a WAL of the whole store, the first rebuilds
    # would time several times slower than any later.
    with create_engine(f"sqlite:///{path}").connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))


def instants(batches: int, rounds: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(batches // 2, batches) for _ in range(rounds)]


def child(path: str, seqs: list[int]) -> None:
    """The rebuilds, their loop the only code counted (callgrind counts inside `deque_init`)."""
    engine = open_store(f"sqlite:///{path}")
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        positions = [position_at_seq(conn, sid, seq) for seq in seqs]
        gc.disable()
        deque((rebuild(conn, p, STREAM) for p in positions), maxlen=0)


def replayed(path: Path, seqs: list[int]) -> int:
    with open_store(f"sqlite:///{path}").connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        return sum(
            rebuild(conn, position_at_seq(conn, sid, s), STREAM).batches_replayed for s in seqs
        )


def timed(path: Path, seqs: list[int], rounds: int) -> float:
    """Median seconds of a rebuild at `seqs`, over `rounds` rounds."""
    times = []
    with open_store(f"sqlite:///{path}").connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        for _ in range(rounds):
            for seq in seqs:
                started = time.perf_counter()
                rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def counted(path: Path, seqs: list[int], out: str, annotate: bool) -> tuple[int, int, int]:
    """Instructions of the whole rebuild loop, of the replay inside it, and of its fused
    checks and writes."""
    command = [sys.executable, __file__, "--child", str(path), json.dumps(seqs)]
    run_child(command, out, flags=["--dump-instr=no"])
    report = annotated(out)
    if annotate:
        print("\n".join(annotated(out, inclusive=False, threshold=99).splitlines()[:60]))
    total, replay, fused = (count(report, name) for name in ("PROGRAM TOTALS", REPLAY, FUSED))
    return total, replay, fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000, help="block-events in the stream")
    parser.add_argument("--cached", type=int, default=100_000, help="cached blocks when full")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rebuilds", type=int, default=8, help="instants rebuilt")
    parser.add_argument("--formats", default="2,4")
    parser.add_argument("--stores", help="a folder to keep the stores in and reuse them from")
    parser.add_argument("--timed", type=int, default=0, help="rounds of timed rebuilds")
    parser.add_argument("--annotate", action="store_true", help="the top functions, exclusive")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return
    payloads, stats = store_stream("rebuild_instructions.py", args.events, args.seed, args.cached)
    print(f"kvscope from {Path(replay_module.__file__).parent.parent}")
    per_batch = stats.block_events / len(payloads)
    print(
        f"stream: {stats.block_events:,} block-events in {len(payloads):,} batches "
        f"({per_batch:.2f} a batch), {stats.final_cached:,} blocks cached at the end"
    )
    seqs = instants(len(payloads), args.rebuilds, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.stores or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        tag = f"e{args.events}-c{args.cached}-s{args.seed}"
        for fmt in map(int, args.formats.split(",")):
            # A folder per store (SQLite's WAL beside it), renamed once whole: a run cut short
            # leaves none to reuse.
            path = folder / f"{tag}-f{fmt}" / "store.sqlite"
            if not path.exists():
                building = folder / f"{tag}-f{fmt}.building"
                shutil.rmtree(building, ignore_errors=True)
                building.mkdir()
                store(building / path.name, payloads, fmt)
                building.rename(path.parent)
            batches = replayed(path, seqs)
            total, replay, fused = counted(path, seqs, f"{tmp}/f{fmt}.out", args.annotate)
            print(
                f"format {fmt}: {batches:,} batches replayed over {len(seqs)} rebuilds; "
                f"replay {replay / batches:,.0f} instructions a batch "
                f"({replay / batches / per_batch:,.0f} a block-event), of which the log's "
                f"reading {(replay - fused) / batches:,.0f} and the checks and writes "
                f"{fused / batches:,.0f}; whole rebuild {total / len(seqs) / 1e6:,.1f} M "
                "instructions each"
            )
            if args.timed:
                median = timed(path, seqs, args.timed)
                print(f"  timed: median rebuild {median * 1000:.1f} ms (noisy)")


if __name__ == "__main__":
    main()
