"""The store's sink puts each batch's row with the queue's C put, unless the queue's class
overrides `put_batch` (a test's or a benchmark's): then the override is told of every batch.
The C put appends with `deque.append`'s C function, found once: the queue's references stay
its own."""

from __future__ import annotations

import gc
import sys
from collections import deque
from typing import Any

import pytest

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import write_loop
from kvscope.storage import writer as writer_module
from kvscope.storage.engine import open_store
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import frames, payload


class _Refusing(RowQueue[Any]):
    told: list[Any] = []

    def put_batch(self, row: Any, nbytes: int) -> bool:
        self.told.append(row)
        return False


def _ingest(batches: int) -> StoreWriter:
    writer = StoreWriter(open_store("sqlite://"), StoreSettings(spill_bytes=0))
    stream = StreamId("queue", 0)
    ingest = StreamIngest(stream, can_replay=False, sink=writer)
    for seq in range(1, batches + 1):
        ingest.live_frames(frames(seq, payload(ts=1_796_051_000.0 + seq)), 1_796_051_000.5 + seq)
    return writer


def test_a_put_batch_override_is_told_of_each_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    monkeypatch.setattr(writer_module, "RowQueue", _Refusing)
    monkeypatch.setattr(_Refusing, "told", [])
    writer = _ingest(5)
    assert [row[2] for row in _Refusing.told if type(row) is tuple] == [1, 2, 3, 4, 5]
    # Every batch refused: none is in memory, and the drop is noted.
    assert not any(type(row) is tuple for row in writer._queue._rows)
    assert writer._streams[StreamId("queue", 0)].dropped_from is not None


def test_the_plain_queue_holds_each_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    writer = _ingest(5)
    assert [row[2] for row in writer._queue._rows if type(row) is tuple] == [1, 2, 3, 4, 5]
    assert writer._streams[StreamId("queue", 0)].dropped_from is None


def test_a_queue_holds_a_reference_of_its_own_to_its_rows() -> None:
    """Finding `deque.append`'s C function reads the bound method's `self`, a borrowed
    reference: given back as if owned, the deque lost one, and was freed with the queue while
    others still held it."""
    queue: RowQueue[Any] = RowQueue(10)
    rows = queue._rows
    # Its holders: the queue's field, the queue's bound `append`, `rows`, and the argument.
    assert sys.getrefcount(rows) == 4
    assert queue.put_batch("kept", 0)  # the C put
    del queue
    gc.collect()
    other = deque(["another's"])
    assert rows is not other and list(rows) == ["kept"]
