"""The hand-off between the ingest thread and the store's writer thread.

A deque and an event: putting a row costs an append (the ingest thread must not wait), and only
the rows that may be dropped count towards the bound; the rare ones always get in.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

Row = TypeVar("Row")


class RowQueue(Generic[Row]):
    """One producer (the ingest thread), one consumer (the writer thread)."""

    def __init__(self, droppable_limit: int) -> None:
        self.droppable_limit = droppable_limit
        self._rows: deque[tuple[Row, bool]] = deque()
        self._wake = threading.Event()
        self._closed = False
        self.put_count = 0
        self.done_count = 0
        self._droppable_in = 0
        self._droppable_out = 0

    def put(self, row: Row, droppable: bool) -> bool:
        """Queue `row`; a droppable one is refused (False) when the bound is reached."""
        if droppable:
            if self._droppable_in - self._droppable_out >= self.droppable_limit:
                return False
            self._droppable_in += 1
        self._rows.append((row, droppable))
        self.put_count += 1
        if not self._wake.is_set():
            self._wake.set()
        return True

    def close(self) -> None:
        """No more rows: `take` returns None once the queue is empty."""
        self._closed = True
        self._wake.set()

    def take(self, max_rows: int) -> list[tuple[Row, bool]] | None:
        """Up to `max_rows` rows, waiting for one; None once closed and drained."""
        rows = self._rows
        while True:
            if rows:
                return [rows.popleft() for _ in range(min(max_rows, len(rows)))]
            if self._closed:
                return None
            self._wake.clear()
            if not rows and not self._closed:  # re-check: a put may have come in between
                self._wake.wait(1.0)

    def done(self, taken: list[tuple[Row, bool]]) -> None:
        """`taken` is in the store: free its room."""
        self._droppable_out += sum(1 for _, droppable in taken if droppable)
        self.done_count += len(taken)

    @property
    def pending(self) -> int:
        """Rows queued or being written, not yet in the store."""
        return self.put_count - self.done_count
