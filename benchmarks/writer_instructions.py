"""The store writer thread's instructions on benchmarks/store.py's stream, per function: where
the writer's CPU goes on the real stream, in counts that hold still on a shared machine.

    python benchmarks/writer_instructions.py [--events N] [--cached C] [--seed S] [--top K]
                                             [--match REGEX]

benchmarks/store_instructions.py's `writer` count runs a small stream with checkpoints off, on
which a stream's content never holds steady (every payload's content is noted, where store.py's
stream notes one batch in `SAMPLE` once it does). Here the stream is store.py's (1M block-events
by default) and the store's settings are store.py's (checkpoints on): the stream is ingested
into a StoreWriter on a SQLite file with its writer thread kept from taking rows, then the
writer's loop runs over all that was queued on the main thread, counted by callgrind (rows taken
`rows_per_transaction` at a time, as the writer thread takes them while it is behind).

It prints the writer's instructions per batch, then the `--top` functions by inclusive count
whose names match `--match` (kvscope's own, by default), per batch; with `--inlined`, also each
Cython function's self count, inlined ones apart (benchmarks/_inlined_costs.py). Needs valgrind.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import deque
from pathlib import Path

from _callgrind import (
    annotated,
    mark,
    read_payloads,
    run_child,
    say_source,
    source,
    store_stream,
    window_collected,
    window_file,
    write_payloads,
)
from _inlined_costs import self_costs

HERE = Path(__file__).resolve().parent
CLOCK_START = 1_796_051_000.0
"""The receive clock, fixed: `time.time()` would differ between runs."""
KVSCOPE = r"kvscope|__pyx_|pack_runs|note_run|split|join|same_|planes|known|ZSTD_compress"
"""Functions reported by default: kvscope's (Python and Cython) and zstd's compression."""


def child(payloads_file: str, db_file: str) -> None:
    """The ingest, not counted, then the writer's loop over all it queued, counted."""
    import gc

    from kvscope.collector.ingest import StreamIngest
    from kvscope.collector.types import StreamId
    from kvscope.storage import write_loop
    from kvscope.storage.engine import open_store
    from kvscope.storage.store_settings import StoreSettings
    from kvscope.storage.writer import StoreWriter

    say_source(write_loop.__file__)
    run_writer = write_loop.WriteLoop._run
    write_loop.WriteLoop._run = lambda self: None  # type: ignore[method-assign]
    payloads = read_payloads(payloads_file)
    writer = StoreWriter(open_store(f"sqlite:///{db_file}"), StoreSettings(queue_rows=10_000_000))
    ingest = StreamIngest(StreamId("bench", 0), can_replay=False, sink=writer)
    gc.disable()  # the rows pile up here, where the writer thread would free them
    for seq, payload in enumerate(payloads):
        ingest.live_frames([b"", seq.to_bytes(8, "big"), payload], CLOCK_START + 0.001 * seq)
    gc.enable()
    writer.close(0)
    mark()
    deque(map(run_writer, [writer._loop]), maxlen=0)
    mark()
    assert writer.stats.rows_written >= len(payloads) and writer.failure is None
    print(f"transactions {writer.stats.transactions}", file=sys.stderr)


def per_function(report: str, pattern: str, top: int) -> list[tuple[int, str]]:
    """The `top` largest inclusive counts of functions whose names match `pattern`."""
    found: dict[str, int] = {}
    for line in report.splitlines():
        parts = re.match(r"^\s*([\d,]+) \([^)]*\)\s+(\S+:\S+)", line)
        if parts is None or not re.search(pattern, parts.group(2)):
            continue
        name = parts.group(2)
        found[name] = max(found.get(name, 0), int(parts.group(1).replace(",", "")))
    return sorted(((n, name) for name, n in found.items()), reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="block-events to ingest")
    parser.add_argument("--cached", type=int, default=100_000, help="cached blocks when full")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--top", type=int, default=40, help="functions to report")
    parser.add_argument("--match", default=KVSCOPE, help="functions to report: a regex")
    parser.add_argument("--inlined", type=int, default=0, help="Cython functions to report")
    parser.add_argument("--keep", help="a folder to keep callgrind's profile in")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    payloads, stats = store_stream("writer_instructions.py", args.events, args.seed, args.cached)
    batches = len(payloads)
    print(f"stream: {stats.block_events:,} block-events in {batches:,} batches")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or tmp
        out_file = f"{out_dir}/writer.out"
        payloads_file = write_payloads(payloads, tmp)
        command = [sys.executable, __file__, "--child", payloads_file, f"{tmp}/store.sqlite"]
        stderr = run_child(command, out_file, marked=True)
        print(f"kvscope from {source(stderr)}")
        found = re.search(r"transactions (\d+)", stderr)
        total = window_collected(out_file)
        report = annotated(window_file(out_file))
        inlined = self_costs(window_file(out_file), str(HERE.parent)) if args.inlined else {}
    print(
        f"writer {total / batches:,.0f} instructions per batch "
        f"({total / stats.block_events:,.0f} per block-event), "
        f"{found.group(1) if found else '?'} transactions"
    )
    for n, name in per_function(report, args.match, args.top):
        print(f"{n / batches:10,.0f}  {name}")
    if inlined:
        print("self counts of Cython functions, inlined ones apart:")
    for name, n in sorted(inlined.items(), key=lambda item: -item[1])[: args.inlined]:
        print(f"{n / batches:10,.0f}  {name}")


if __name__ == "__main__":
    main()
