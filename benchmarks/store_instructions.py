"""What the store's sink costs the ingest thread per batch, in instructions counted by callgrind:
a figure that holds still on a shared machine, where timings do not.

    python benchmarks/store_instructions.py [--events N] [--cached C] [--seed S] [--parts]
                                            [--store sqlite|postgresql]

The stream (benchmarks/ingest.py's model, made once, outside valgrind) is ingested three times
under valgrind's callgrind, counting only the ingest loop's instructions:
- `memory`: no sink (the baseline);
- `calls`: a sink that only takes the calls: what any sink costs the collector (an
  `AppliedBatch` per batch, the `instant` test);
- `store`: the store's writer, its writer thread kept from taking rows (so that nothing depends
  on timing: the GIL is not shared) and checkpoints off (a checkpoint's map copy is a cost
  per checkpoint, not per batch; the pacer's count still runs).
- `writer`: the same ingest, not counted, then the writer's loop over all it queued, counted, run
  on the main thread (rows taken `rows_per_transaction` at a time, as the writer thread takes
  them): the other thread's work, which the `store` count leaves out. Of it, what runs inside the
  calls that let go of the GIL (zstd, the log's split and join walks, sqlite3_step: callgrind's
  inclusive counts) is apart; the rest holds the GIL, and with two threads on two cores only
  that part cannot overlap the ingest thread. It also counts how many times the writer run let
  go of the GIL (calls of PyEval_SaveThread: each takes it back after, and taking it from a
  busy ingest thread is a wait), per transaction, and by the function that let go: sqlite3's
  statements (its BEGIN, and around each statement's binding count, step, column count, reset
  and last row id), its statements prepared (one per new SQL text: a multi-row INSERT's text
  changes with its rows), rows fetched (one per column), commits; zstd; the log's walks;
  psycopg.
  This run counts calls exactly, its window marked (benchmarks/_callgrind.py): with callgrind's
  window alone, calls made outside it were counted too, the store's migrations' above all (a
  hand-back for each column of each row they fetched), several times the writer's own.
`--store postgresql` runs each kind on a fresh PostgreSQL database (benchmarks/_pg.py) instead of
an in-memory SQLite one.
It prints instructions per batch of each, and the sink's and the writer's share; with `--parts`,
also each part of the writer's share: the store run again with that part left out (the row put
on the queue, the rollup's count, the checkpoint pacer's, the `instant` calls). Needs valgrind.
"""

from __future__ import annotations

import argparse
import gc
import math
import re
import sys
import tempfile
from collections import deque
from contextlib import ExitStack
from itertools import starmap
from pathlib import Path

from _callgrind import (
    calls_to,
    collected,
    gil_free,
    mark,
    read_payloads,
    run_child,
    store_stream,
    window_collected,
    window_file,
    write_payloads,
)

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import NO_BATCH, AppliedBatch, EventSink, MapReader, NullSink, Span
from kvscope.collector.types import StreamId
from kvscope.storage import rollups as rollups_module
from kvscope.storage import write_loop
from kvscope.storage import writer as writer_module
from kvscope.storage._checkpoint_pacing import CheckpointPacer
from kvscope.storage._rollup_counts import RollupCounts
from kvscope.storage.engine import open_store
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

KINDS = ("memory", "calls", "store", "writer")
PARTS = {
    "queue": "the batch's row put on the queue",
    "rollup": "the rollup's count of the batch (and its sums at each second's end)",
    "pacer": "the checkpoint pacer's count",
    "instant": "the `instant` calls (rollup rows at each second's end)",
}
CLOCK_START = 1_796_051_000.0
"""The receive clock, fixed: `time.time()` would differ between runs."""
RELEASERS = (
    ("sqlite3 statements", ("_pysqlite_query_execute",)),
    ("prepares", ("pysqlite_statement_create",)),
    ("rows fetched", ("_pysqlite_fetch_one_row", "pysqlite_cursor_fetchone", "iternext")),
    ("commits", ("pysqlite_connection_commit", "pysqlite_connection_rollback")),
    ("zstd", ("compress",)),
    ("psycopg", ("psycopg",)),
    ("log walks", ("_log_columns_", "_log_planes_", "_token_granules_")),
)
"""The functions that let go of the GIL in the writer's run, by what they do (a name holding
one of the parts)."""


def child(kind: str, payloads_file: str, url: str) -> None:
    """One ingest, its loop the only code counted (callgrind counts inside `deque_init`; the
    `writer` kind's, between its `mark()`s)."""

    class Calls(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            return None

        def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
            return NO_BATCH

    run_writer = write_loop.WriteLoop._run
    write_loop.WriteLoop._run = lambda self: None  # type: ignore[method-assign]
    if kind in PARTS:
        _leave_out(kind, Calls)
        kind = "store"
    payloads = read_payloads(payloads_file)
    # Built in every kind, so that only the loop differs.
    writer = StoreWriter(
        open_store(url),
        StoreSettings(
            queue_rows=10**9,
            checkpoint_events_per_block=math.inf,
            checkpoint_every_batches=10**9,
            spill_bytes=0,
        ),
    )
    sink: EventSink | None = {"memory": None, "calls": Calls(), "store": writer, "writer": writer}[
        kind
    ]
    ingest = StreamIngest(StreamId("bench", 0), can_replay=False, sink=sink)
    frames = [[b"", seq.to_bytes(8, "big"), p] for seq, p in enumerate(payloads)]
    clock = [CLOCK_START + 0.001 * i for i in range(len(frames))]
    # The writer thread frees the rows in a real run, where the loop meets next to no
    # collection: here they pile up, and collections would walk them.
    gc.disable()
    if kind != "writer":
        deque(starmap(ingest.live_frames, zip(frames, clock, strict=True)), maxlen=0)
        assert ingest.counters.batches_applied == len(frames)
        return
    # The same ingest, not counted; then the writer's loop over all it queued, counted, on this
    # thread (rows taken `rows_per_transaction` at a time, as the writer thread takes them).
    for frame, at in zip(frames, clock, strict=True):
        ingest.live_frames(frame, at)
    writer.close(0)
    mark()
    deque(map(run_writer, [writer._loop]), maxlen=0)
    mark()
    assert writer.stats.rows_written >= len(frames) and writer.failure is None
    print(f"transactions {writer.stats.transactions}", file=sys.stderr)


def _leave_out(part: str, calls: type[NullSink]) -> None:
    """The store's writer without `part`: what is left costs what it did (nothing downstream of
    these runs on the ingest thread)."""
    if part == "queue":
        RowQueue.put_batch = lambda self, row, nbytes: True  # type: ignore[method-assign]
    elif part == "rollup":
        # An extension type again: the rollup is given counts without.
        class NoRollupCount(RollupCounts):
            def count(self, changes: object) -> int:
                return 0

        rollups_module.RollupCounts = NoRollupCount  # type: ignore[attr-defined]
    elif part == "pacer":
        # An extension type's methods cannot be replaced: the writer is given a pacer without.
        class NoCount(CheckpointPacer):
            def counted(self, events: int) -> bool:
                return False

        writer_module.CheckpointPacer = NoCount  # type: ignore[attr-defined]
    else:
        StoreWriter.instant = calls.instant  # type: ignore[method-assign,assignment]


def instructions(kind: str, payloads_file: str, out_dir: str, url: str) -> int:
    command = [sys.executable, __file__, "--child", kind, payloads_file, url]
    out_file = f"{out_dir}/{kind}.out"
    stderr = run_child(command, out_file, marked=kind == "writer")
    Path(f"{out_dir}/{kind}.stderr").write_text(stderr)
    return window_collected(out_file) if kind == "writer" else collected(stderr)


def hand_backs(out_dir: str) -> tuple[dict[str, int], int]:
    """The writer run's calls of PyEval_SaveThread (each lets go of the GIL, and each return
    takes it back: from a busy ingest thread, a wait), by what let go (`RELEASERS`, else the
    function's name), and its transactions."""
    each: dict[str, int] = {}
    for caller, n in calls_to(window_file(f"{out_dir}/writer.out"), "PyEval_SaveThread").items():
        name = next((what for what, parts in RELEASERS if any(p in caller for p in parts)), caller)
        each[name] = each.get(name, 0) + n
    found = re.search(r"transactions (\d+)", Path(f"{out_dir}/writer.stderr").read_text())
    assert found
    return each, int(found.group(1))


def store_url(store: str, stack: ExitStack) -> str:
    """A store for one child: SQLite in memory, or a fresh PostgreSQL database."""
    if store == "sqlite":
        return "sqlite://"
    from _pg import database_url, fresh_database

    return database_url(stack.enter_context(fresh_database("storeinstr_")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="block-events to ingest")
    parser.add_argument("--cached", type=int, default=20_000, help="cached blocks when full")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parts", action="store_true", help="also each part's share")
    parser.add_argument("--store", default="sqlite", choices=("sqlite", "postgresql"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    payloads, stats = store_stream("store_instructions.py", args.events, args.seed, args.cached)
    batches = len(payloads)
    print(f"stream: {stats.block_events:,} block-events in {batches:,} batches")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        payloads_file = write_payloads(payloads, tmp)
        kinds = (*KINDS, *PARTS) if args.parts else KINDS
        counts = {
            kind: instructions(kind, payloads_file, tmp, store_url(args.store, stack))
            for kind in kinds
        }
        each_free = gil_free(window_file(f"{tmp}/writer.out"))
        released, transactions = hand_backs(tmp)
    free = sum(each_free.values()) / batches
    per_batch = {kind: count / batches for kind, count in counts.items()}
    for kind in KINDS:
        print(f"{kind:<8} {per_batch[kind]:10,.0f} instructions per batch")
    writer, memory = per_batch["writer"], per_batch["memory"]
    print(
        f"the writer thread's {writer:,.0f}: {free:,.0f} in calls that let go of the GIL, "
        f"{writer - free:,.0f} holding it"
    )
    print("  " + ", ".join(f"{name} {n / batches:,.0f}" for name, n in sorted(each_free.items())))
    print(
        f"  it let go of the GIL {sum(released.values()):,} times in {transactions} "
        f"transactions: {sum(released.values()) / transactions:,.1f} a transaction"
    )
    by_count = sorted(released.items(), key=lambda item: -item[1])
    print("  " + ", ".join(f"{name} {n / transactions:,.1f}" for name, n in by_count))
    print(
        f"store on, all threads: {(per_batch['store'] + writer) / memory:.2f}x memory-only; "
        f"holding the GIL (what two threads cannot overlap): "
        f"{(per_batch['store'] + writer - free) / memory:.2f}x"
    )
    print(
        f"the sink adds {per_batch['store'] - per_batch['memory']:,.0f} per batch "
        f"({per_batch['store'] / per_batch['memory']:.2f}x memory-only), of which the calls "
        f"{per_batch['calls'] - per_batch['memory']:,.0f} and the store's writer "
        f"{per_batch['store'] - per_batch['calls']:,.0f}"
    )
    for part, what in PARTS.items() if args.parts else ():
        print(f"  {per_batch['store'] - per_batch[part]:8,.0f} per batch: {what}")


if __name__ == "__main__":
    main()
