"""What a reset's follower says it holds (`ResetFollower.nbytes`, the figure the store's writer
bounds its followers by: storage/prefix_followers.py) is what it holds, within a margin: not
less (a fleet's followers would take more than `prefix_follower_bytes`), and not far more (fewer
followers would be held than fit, and the rest answered by rebuilding from the store)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import ClearReason
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.reset_follower import ResetFollower
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import CLEAR, frames, payload, remove, store

ROOTS = 100
TRUNK = 20
BRANCHES = 4
BRANCH = 20
"""A map of 100 prompt trees (a trunk of 20 blocks, 4 branches of 20 under it): 10,000 blocks,
whose slot maps are small enough to come from Python's allocator, which tracemalloc sees
(larger ones are mapped)."""
OFFSETS = (1.0, 2.0, 5.0)


def _trees() -> list[dict[str, Any]]:
    events = []
    for root in range(ROOTS):
        first = 10_500 + root * 1_000  # tokens h % 1000: not cached small ints
        trunk_end = first + TRUNK - 1
        events.append(store(*range(first, trunk_end + 1)))
        for b in range(BRANCHES):
            start = first + TRUNK + b * BRANCH
            events.append(store(*range(start, start + BRANCH), parent=trunk_end))
    return events


def _orphans() -> list[dict[str, Any]]:
    """After the clear, every other block of the trees alone, each under the block before it,
    which is gone (as vLLM's `keep_running_requests` leaves them): 5,000 orphans."""
    hashes = [h for e in _trees() for h in e["block_hashes"]]
    return [store(h, parent=h - 1) for h in hashes if h % 2]


def _churn() -> list[dict[str, Any]]:
    """After the clear, a prompt's first blocks cached again, and 20,000 continuations stored
    under them and evicted (a shared system prompt's requests): the map stays small, what the
    follower records of it grows with every block stored, and it says so."""
    events = [store(10_500, 10_501)]
    for k in range(20_000):
        leaf = 2_000_000 + k
        events += [store(leaf, parent=10_501), remove(leaf)]
    return events


RECOVERIES = {
    "before map alone": [],
    "trees stored again": _trees(),
    "orphans": _orphans(),
    "churn": _churn(),
}


def _held(tmp_path: Path, after_clear: list[dict[str, Any]]) -> tuple[ResetFollower, int]:
    """A follower fed its recovery, and the bytes it holds (tracemalloc)."""
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(StreamId("r", 0), can_replay=False, sink=writer)
    batches = [(1.0, _trees()), (10.0, [CLEAR]), (10.5, after_clear), (100.0, [store(1)])]
    for seq, (ts, events) in enumerate(batches):
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()
    with writer.engine.connect() as conn:
        r = schema.resets
        reset_id = conn.execute(
            select(r.c.id).where(r.c.reason == ClearReason.ALL_BLOCKS_CLEARED.value)
        ).scalar_one()
        list(ResetFollower(conn, reset_id).advance(conn, OFFSETS))  # the caches made first
        gc.collect()
        tracemalloc.start()
        try:
            follower = ResetFollower(conn, reset_id)
            list(follower.advance(conn, OFFSETS))
            follower.result(False)  # (it keeps the answer's groups)
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return follower, held


@pytest.mark.parametrize("recovery", list(RECOVERIES))
def test_a_followers_bytes_are_what_it_holds(tmp_path: Path, recovery: str) -> None:
    follower, held = _held(tmp_path, RECOVERIES[recovery])
    assert sum(map(len, follower.marks.values())) == ROOTS * (TRUNK + BRANCHES * BRANCH)
    assert len(follower.roots) == ROOTS
    followed = sum(len(table) for table in follower.view.tables.values())
    stored = sum(len(e.get("block_hashes", ())) for e in RECOVERIES[recovery])
    assert followed == (2 if recovery == "churn" else stored)
    if recovery == "orphans":
        assert len(follower.orphans.found) == followed
    said = follower.nbytes()
    assert held <= said <= 1.5 * held, (held, said)
