"""Rows the store's queue has no room for, kept in a local file until the store takes them.

During a long store outage at a high event rate the bounded queue fills; without a spill every
further batch would be dropped (declared as an `incomplete` interval, but a hole in history).
The spill takes the queue's overflow in order, up to `max_bytes` on disk, and the writer drains
it, oldest first, once the store answers again. Only past its cap is anything dropped.

The file is anonymous (deleted by the system when the process ends): a crash loses what waits
in it, as it loses what waits in memory, and the restart asks the publishers' replay sockets
for what the store lacks. One producer (the ingest thread), one consumer (the writer thread).
"""

from __future__ import annotations

import pickle
import tempfile
import threading
from typing import IO, Generic, TypeVar

from kvscope.storage._queue_core import SpillState

Row = TypeVar("Row")
_LEN = 4


class Spill(SpillState, Generic[Row]):
    """`active` is `SpillState`'s C field: the queue's put reads it for every batch."""

    def __init__(self, max_bytes: int, directory: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.directory = directory
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._write_at = 0
        self._read_at = 0
        self._rows = 0
        self.active = False
        """Rows wait here: every later row that may be dropped must come here too, after them,
        or the store would get them out of order."""
        self.rows_total = 0
        """Rows ever spilled."""
        self.rows_taken_total = 0
        """Rows ever taken back: row number `n` of `rows_total` is out once this reaches it."""

    def put(self, row: Row, past_cap: bool = False) -> bool:
        """Keep `row` after those waiting; False (not kept) once the file would pass its cap,
        unless `past_cap`: a row that must never be dropped (the cap is for those that may)."""
        data = pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if not past_cap and self._write_at + _LEN + len(data) > self.max_bytes:
                return False
            if self._file is None:
                # Kept open across calls; closed by `close`.
                self._file = tempfile.TemporaryFile(prefix="kvscope-spill-", dir=self.directory)  # noqa: SIM115
            self._file.seek(self._write_at)
            self._file.write(len(data).to_bytes(_LEN, "big") + data)
            self._write_at += _LEN + len(data)
            self._rows += 1
            self.rows_total += 1
            self.active = True
        return True

    def take(self, max_rows: int, max_bytes: int | None = None) -> list[Row]:
        """The oldest waiting rows, up to `max_rows` and (past the first) `max_bytes` of them
        as kept; the file is emptied once all are taken."""
        with self._lock:
            if self._file is None or not self._rows:
                return []
            self._file.seek(self._read_at)
            rows: list[Row] = []
            budget = max_bytes if max_bytes is not None else self._write_at
            while len(rows) < max_rows and self._read_at < self._write_at:
                size = int.from_bytes(self._file.read(_LEN), "big")
                if rows and size > budget:
                    self._file.seek(-_LEN, 1)
                    break
                rows.append(pickle.loads(self._file.read(size)))
                self._read_at += _LEN + size
                budget -= size
            self._rows -= len(rows)
            self.rows_taken_total += len(rows)
            if self._read_at >= self._write_at:
                self._file.seek(0)
                self._file.truncate()
                self._read_at = self._write_at = 0
                self.active = False
            return rows

    def __len__(self) -> int:
        return self._rows

    @property
    def bytes_held(self) -> int:
        return self._write_at - self._read_at

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
