"""The hand-off between the ingest thread and the store's writer thread.

A deque: putting a row costs an append and no signal (the ingest thread must not wait): the
writer looks again every `poll_s` when it finds the queue empty, and gives a short queue that
long to fill, so that it takes rows by the thousand, not each as it comes at the price of a
thread switch and a transaction. Only the rows that may be dropped count towards the bound; the
rare ones always get in.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

Row = TypeVar("Row")


class RowQueue(Generic[Row]):
    """One producer (the ingest thread), one consumer (the writer thread)."""

    def __init__(self, droppable_limit: int, poll_s: float = 0.02) -> None:
        self.droppable_limit = droppable_limit
        self.poll_s = poll_s
        self._rows: deque[Row] = deque()
        self._closing = threading.Event()
        self._droppable_in = 0
        self._droppable_out = 0
        self._taken = 0

    def put(self, row: Row, droppable: bool) -> bool:
        """Queue `row`; a droppable one is refused (False) when the bound is reached."""
        if droppable:
            if self._droppable_in - self._droppable_out >= self.droppable_limit:
                return False
            self._droppable_in += 1
        self._rows.append(row)
        return True

    def close(self) -> None:
        """No more rows: `take` returns None once the queue is empty."""
        self._closing.set()

    def take(self, max_rows: int) -> list[Row] | None:
        """Up to `max_rows` rows, waiting for one; None once closed and drained."""
        rows = self._rows
        while True:
            if rows:
                if len(rows) < max_rows and not self._closing.is_set():
                    # A moment for more: one transaction of many rows costs less than many.
                    self._closing.wait(self.poll_s)
                n = self._taken = min(max_rows, len(rows))
                return [rows.popleft() for _ in range(n)]
            if self._closing.is_set():
                if rows:  # put just before the close
                    continue
                return None
            self._closing.wait(self.poll_s)

    def done(self, droppable: int) -> None:
        """The rows last taken are in the store, `droppable` of them droppable: free their room."""
        self._droppable_out += droppable
        self._taken = 0

    @property
    def pending(self) -> int:
        """Rows queued or being written, not yet in the store."""
        return len(self._rows) + self._taken
