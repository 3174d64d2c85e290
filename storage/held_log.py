"""One stream's log as the store's writer wrote it, held in memory for its prefix followers
(storage/prefix_followers.py): the batches of `epoch` past `after`, exactly those the store
holds, so that following a recovery need not read back the chunks just written.

Exact or not at all: `rows` holds every batch the writer wrote of `epoch` past `after`, in seq
order (a batch dropped from the queue is not written, so not held: a gap the store has too). A
batch that comes out of order, or unlike the one already held under its seq, makes the log
unknown (`add` says False), and the followers read the store again.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from operator import itemgetter

from kvscope.collector.types import StreamId
from kvscope.storage.log_chunks import LoggedBatch
from kvscope.storage.rows import LogRow

_seq = itemgetter(2)
_payload = itemgetter(5)


class HeldLog:
    __slots__ = ("epoch", "after", "rows", "next", "nbytes")

    def __init__(self, epoch: int, after: int) -> None:
        self.epoch = epoch
        self.after = after
        self.rows: list[LogRow] = []
        self.next = after + 1
        """The least seq a new batch may have (every seq below is held or was never written)."""
        self.nbytes = 0

    @classmethod
    def read_back(
        cls, stream: StreamId, epoch: int, after: int, batches: Iterable[LoggedBatch]
    ) -> HeldLog:
        """From the store's batches of `epoch` past `after` (all of them, in order)."""
        held = cls(epoch, after)
        for b in batches:
            held.rows.append((stream, epoch, b.seq, b.ts, b.recv_ts, b.payload))
            held.nbytes += len(b.payload)
            held.next = b.seq + 1
        return held

    def add(self, row: LogRow) -> bool:
        """A batch of the stream written (`row[1]` is `epoch`); False: the log is unknown now."""
        seq = row[2]
        if seq >= self.next:  # the next one, or past a batch that was dropped
            self.rows.append(row)
            self.nbytes += len(row[5])
            self.next = seq + 1
            return True
        if seq <= self.after:
            return True  # before what is held (the batches up to the clear)
        # Written again (a transaction retried row by row), or out of order.
        i = bisect_right(self.rows, seq, key=_seq) - 1
        return i >= 0 and self.rows[i][2] == seq and self.rows[i][5] == row[5]

    def since(self, epoch: int, after: int) -> Iterator[LogRow] | None:
        """The batches of `epoch` past `after`, in order, as written (None: they are not all
        held)."""
        if epoch != self.epoch or after < self.after:
            return None
        start = bisect_right(self.rows, after, key=_seq)
        return iter(self.rows[start:])

    def trim(self, after: int) -> None:
        """Only the batches past `after` are wanted from now on."""
        if after <= self.after:
            return
        start = bisect_right(self.rows, after, key=_seq)
        self.nbytes -= sum(map(len, map(_payload, self.rows[:start])))
        del self.rows[:start]
        self.after = after
        self.next = max(self.next, after + 1)
