"""The hand-off between the ingest thread and the store's writer thread.

A deque: putting a row costs an append and no signal (the ingest thread must not wait): the
writer looks again every `poll_s` when it finds the queue empty, and gives a short queue up to
`linger_s` to fill, so that it takes rows by the thousand, not each as it comes at the price of
a thread switch, a transaction and a log chunk of its own. The writer's idle work
(storage/log_repack.py's re-packing, then storage/free_pages.py's pages given back) fills those
waits, a short step at a time.

Memory is bounded twice: in rows that may be dropped (`droppable_limit`), and in bytes (each
row's size as its producer gives it: a batch's payload, a map snapshot) of all rows held. A
droppable row past either bound is refused; the rare ones (resets, epochs, recoveries,
intervals) always get in. With a `Spill`, droppable rows past a bound go to a local file
instead (storage/spill.py), and every later one after them, until the writer has taken them
all: they reach the store in the order they came. Rare rows past `rare_bytes_limit` go to the
spill too, even past its cap: on disk, never dropped, and the rare rows after them follow
them there until they are taken (rare rows keep their order). Without a spill they stay in
memory.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Generic, TypeVar

from kvscope.storage._queue_core import QueueCore
from kvscope.storage.spill import Spill

Row = TypeVar("Row")


class RowQueue(QueueCore, Generic[Row]):
    """One producer (the ingest thread), one consumer (the writer thread). The counts, and
    `put_batch`, the put of every batch, are in C (storage/_queue_core.pyx)."""

    # The base's attributes, as this queue's rows make them (annotations only: no class
    # attribute hides the base's).
    _rows: deque[Row]
    spill: Spill[Row] | None

    def __init__(
        self,
        droppable_limit: int,
        poll_s: float = 0.02,
        linger_s: float = 0.02,
        spill: Spill[Row] | None = None,
        bytes_limit: int = sys.maxsize,
        rare_bytes_limit: int = sys.maxsize,
        take_spilled_bytes: int = 64 << 20,
    ) -> None:
        self.droppable_limit = droppable_limit
        self.bytes_limit = bytes_limit
        self.rare_bytes_limit = rare_bytes_limit
        self.take_spilled_bytes = take_spilled_bytes
        """What one `take` reads back from the spill, past its first row."""
        self.spill = spill
        self._taken_spilled = 0
        self.poll_s = poll_s
        self.linger_s = linger_s
        self._taken_bytes = 0
        self.rare_spilled_total = 0
        """Rare rows that waited in the spill (memory held `rare_bytes_limit` already)."""
        self._last_rare_spilled = 0
        """The spill's row number of the last rare row put there."""
        self._closing = threading.Event()
        self._hurry = threading.Event()
        self._wake = self._hurry
        self._hurry_to = 0
        """`put_total` when last hurried: the hurry ends with the take that reaches that row."""
        self._taken_total = 0
        """Rows ever taken (from memory or the spill), in the order they were put."""
        self._taken = 0
        self.written_total = 0

    def put(self, row: Row, droppable: bool, nbytes: int = 0) -> bool:
        """Queue `row` of `nbytes`; a droppable one is refused (False) past a bound. A row
        larger than a bound still gets into an empty queue."""
        if droppable:
            return self.put_batch(row, nbytes)
        spill = self.spill
        held = self._bytes_in - self._bytes_out
        if spill is not None and (
            (held and held + nbytes > self.rare_bytes_limit)
            or spill.rows_taken_total < self._last_rare_spilled
        ):
            # Behind a rare row still on disk, a rare row waits there too: a recovery names
            # its reset, which must reach the store first.
            spill.put(row, past_cap=True)
            self._last_rare_spilled = spill.rows_total
            self.rare_spilled_total += 1
            self._others_in += 1
            return True
        self._others_in += 1
        self._keep(row, nbytes)
        return True

    @property
    def put_total(self) -> int:
        """Rows ever queued (a mark for `written_total` to reach). Counted in two parts, so
        that a droppable row put in memory, nearly every row, adds to one counter only."""
        return self._droppable_in + self._others_in

    @property
    def memory_bytes(self) -> int:
        """Bytes of the rows held in memory, not yet in the store."""
        return self._bytes_in - self._bytes_out

    @property
    def spill_active(self) -> bool:
        return self.spill is not None and self.spill.active

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        """No more rows: `take` returns None once the queue is empty."""
        self._closing.set()
        self._hurry.set()

    def hurry(self) -> None:
        """Take what is queued now without lingering. Only as far as the last row queued: in a
        fleet the queue is never found empty, and a hurry that lasted until then made every
        later transaction small (a recovery row's, each a few seconds per stream)."""
        self._hurry_to = self.put_total
        self._hurry.set()

    def _took(self, n: int) -> None:
        self._taken_total += n
        if self._taken_total < self._hurry_to or self._closing.is_set():
            return
        self._hurry.clear()
        if self._hurry_to > self._taken_total:  # hurried again meanwhile (another thread)
            self._hurry.set()

    def take(self, max_rows: int, idle: Callable[[], bool] | None = None) -> list[Row] | None:
        """Up to `max_rows` rows, waiting for one; None once closed and drained. Where it would
        wait (for a first row, or lingering for more), it calls `idle` first, and waits only
        if that did no work (False): never while a whole take is queued, nor once hurried."""
        rows = self._rows
        while True:
            if self.spill_active and len(rows) < max_rows:
                return self._take_with_spill(max_rows)
            if rows:
                # A moment for more: one transaction of many rows costs less than many.
                deadline = time.monotonic() + self.linger_s
                while len(rows) < max_rows and not self._hurry.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if idle is None or not idle():
                        self._wait_for(max_rows, min(self.poll_s, left))
                n = self._taken = min(max_rows, len(rows))
                taken, self._taken_bytes = self._take_front(n)
                self._took(n)
                return taken
            if self._closing.is_set():
                if rows or self.spill_active:  # put just before the close
                    continue
                return None
            self._hurry.clear()
            if idle is None or not idle():
                self._wait_for(max_rows, self.poll_s)

    def _wait_for(self, max_rows: int, timeout: float) -> None:
        """Wait up to `timeout` for a hurry, or for the put that brings the rows queued to
        `max_rows`: a writer behind starts the moment a whole take is queued, not at its next
        poll (for a full take there is nothing to linger for)."""
        if not self._arm_wake(max_rows):
            return  # queued since the take looked: there is nothing to wait for
        try:
            self._hurry.wait(timeout)
        finally:
            self._wake_at = -1

    def _take_with_spill(self, max_rows: int) -> list[Row]:
        """What is queued in memory (the rare rows, and droppable ones older than any spilled),
        then the oldest spilled rows, with no lingering: a backlog is waiting."""
        rows = self._rows
        n = len(rows)
        taken = list(islice(iter(rows.popleft, None), n))
        self._taken_bytes = self._take_sizes(n)
        assert self.spill is not None
        spilled = self.spill.take(max_rows - n, self.take_spilled_bytes)
        self._taken = n + len(spilled)
        self._taken_spilled = len(spilled)
        self._took(self._taken)
        return taken + spilled

    def done(self, droppable: int) -> None:
        """The rows last taken are in the store, `droppable` of them droppable: free their room."""
        # Spilled rows never took room in memory.
        self._droppable_out += droppable - self._taken_spilled
        self._bytes_out += self._taken_bytes
        self.written_total += self._taken
        self._taken = self._taken_spilled = self._taken_bytes = 0

    @property
    def pending(self) -> int:
        """Rows queued, spilled or being written, not yet in the store."""
        return len(self._rows) + self._taken + (len(self.spill) if self.spill is not None else 0)
