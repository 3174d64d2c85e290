"""What the cyclic GC costs ingest with the store on: passes counted, not wall time.

    python benchmarks/store_gc.py [--events N] [--cached C] [--runs R]

Over benchmarks/store.py's stream, memory-only ingest once, then `--runs` store-on runs (SQLite,
default settings but room for the whole run): for each, the GC passes per generation on the
ingest thread and on the writer thread (from `gc.callbacks`) and their summed durations, from
the first batch until the writer has committed the last row. Pass counts follow what the code
allocates and keeps, not the machine's load (storage/gc_policy.py says why they were many).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream

STREAM = StreamId("bench", 0)


class Passes:
    """Every GC pass while `on`: (ingest thread?, generation, seconds)."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list[tuple[bool, int, float]] = []
        self._main = threading.get_ident()
        self._started: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.perf_counter()
        elif self.on and me in self._started:
            took = time.perf_counter() - self._started.pop(me)
            self.seen.append((me == self._main, info["generation"], took))

    def line(self, ingest_thread: bool) -> str:
        per: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])
        for on_ingest, generation, took in self.seen:
            if on_ingest == ingest_thread:
                per[generation][0] += 1
                per[generation][1] += took
        parts = [f"gen{g} {int(n)} passes {t * 1000:.1f} ms" for g, (n, t) in sorted(per.items())]
        return ", ".join(parts) or "no passes"


def run(frames: list[list[bytes]], store: bool, passes: Passes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        writer = None
        if store:
            url = f"sqlite:///{Path(tmp) / 'gc.sqlite'}"
            writer = StoreWriter(open_store(url), StoreSettings(queue_rows=10_000_000))
        ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
        gc.collect()
        passes.seen.clear()
        passes.on = True
        for frame in frames:
            ingest.live_frames(frame, time.time())
        if writer is not None:
            writer.close(600)
        passes.on = False
    print(
        f"{'store on' if store else 'memory-only'} (thresholds {gc.get_threshold()}): "
        f"ingest thread {passes.line(True)}; writer thread {passes.line(False)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="block-events to ingest")
    parser.add_argument("--cached", type=int, default=100_000, help="cached blocks when full")
    parser.add_argument("--runs", type=int, default=3, help="store-on runs")
    args = parser.parse_args()
    payloads, _ = make_stream(args.events, 1, args.cached, 10**12)
    frames = [[b"", seq.to_bytes(8, "big"), p] for seq, p in enumerate(payloads)]
    passes = Passes()
    run(frames, False, passes)
    for _ in range(args.runs):
        run(frames, True, passes)


if __name__ == "__main__":
    main()
