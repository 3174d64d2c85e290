"""The writer thread holds no take once it is written.

The loop kept its last take's rows (a take's payloads, up to `rows_per_transaction` of them)
while it waited for the next take, and through the heap trim after a backlog: freed only at
the next take or at close (benchmarks/_ingest_rss.py --store counted them per cached block)."""

from __future__ import annotations

import gc
import weakref
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.write_loop import WriteLoop
from kvscope.storage.writer_state import WriterStats


class _Row:
    """A row that a weak reference can follow."""


class _Queue:
    """Gives one take of one row, then, at the next take, says whether that row is still
    alive, and closes."""

    memory_bytes = 0
    spill_active = False
    written_total = 0
    put_total = 0

    def __init__(self, row: _Row) -> None:
        self._first: list[Any] | None = [row]
        self._row = weakref.ref(row)
        self.alive_at_next_take: bool | None = None

    def take(self, most: int, idle: object = None) -> list[Any] | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        gc.collect()
        self.alive_at_next_take = self._row() is not None
        return None

    def done(self, droppable: int) -> None:
        pass


class _Sql:
    streams_written = 1

    def prepare(self, rows: list[Any]) -> SimpleNamespace:
        return SimpleNamespace(droppable=0)

    def write(self, conn: Any, prepared: Any) -> None:
        pass

    def committed(self, prepared: Any) -> None:
        pass

    def one_statement(self, prepared: Any, dialect: str) -> bool:
        return False

    def forget_ids(self) -> None:
        pass


def test_the_writer_holds_no_written_take_while_it_waits_for_the_next() -> None:
    row = _Row()
    queue = _Queue(row)
    del row
    engine = SimpleNamespace(begin=nullcontext, dialect=SimpleNamespace(name="sqlite"))
    loop = WriteLoop(engine, queue, _Sql(), StoreSettings(), WriterStats())  # type: ignore[arg-type]
    loop.thread.join(10)
    assert loop.failure is None
    assert queue.alive_at_next_take is False
