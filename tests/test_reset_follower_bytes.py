"""What a reset's follower says it holds (`ResetFollower.nbytes`, the figure the store's writer
bounds its followers by: storage/prefix_followers.py) is what it holds, within a margin: not
less (a fleet's followers would take more than `prefix_follower_bytes`), and not far more (fewer
followers would be held than fit, and the rest answered by rebuilding from the store)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from sqlalchemy import select

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import ClearReason
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.reset_follower import ResetFollower
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import CLEAR, frames, payload, store

ROOTS = 100
TRUNK = 20
BRANCHES = 4
BRANCH = 20
"""A map of 100 prompt trees (a trunk of 20 blocks, 4 branches of 20 under it): 10,000 blocks,
whose marks' slot maps are small enough to come from Python's allocator, which tracemalloc
sees (larger ones are mapped)."""


def _chain(first: int, n: int, parent: int | None) -> dict[str, object]:
    return store(*range(first, first + n), parent=parent)


def test_a_followers_bytes_are_what_it_holds(tmp_path: Path) -> None:
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(StreamId("r", 0), can_replay=False, sink=writer)
    seq = 0
    for root in range(ROOTS):
        first = 10_500 + root * 1_000  # tokens h % 1000: not cached small ints
        events = [_chain(first, TRUNK, None)]
        events += [
            _chain(first + TRUNK + b * BRANCH, BRANCH, first + TRUNK - 1) for b in range(BRANCHES)
        ]
        ingest.live_frames(frames(seq, payload(*events, ts=1.0 + seq)), 1.0 + seq)
        seq += 1
    ingest.live_frames(frames(seq, payload(CLEAR, ts=1.0 + seq)), 1.0 + seq)
    writer.close()
    with writer.engine.connect() as conn:
        r = schema.resets
        reset_id = conn.execute(
            select(r.c.id).where(r.c.reason == ClearReason.ALL_BLOCKS_CLEARED.value)
        ).scalar_one()
        ResetFollower(conn, reset_id)  # the connection's caches made before counting
        gc.collect()
        tracemalloc.start()
        try:
            follower = ResetFollower(conn, reset_id)
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert follower.before_blocks == ROOTS * (TRUNK + BRANCHES * BRANCH)
    assert len(follower.roots) == ROOTS
    said = follower.nbytes()
    assert held <= said <= 1.5 * held, (held, said)
