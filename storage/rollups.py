"""Per-second rollups of one stream, counted on the ingest thread.

A second's row holds the map at its end (the map just before the first batch stamped in a later
second: the sink's `instant` call) and what changed in it: the per-table changes each applied
batch carries, summed, its clears and its gaps. Nothing walks the events of a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvscope.collector.sink import EVERY_BATCH, AppliedBatch, MapReader, Span
from kvscope.collector.types import StreamId, TableKey
from kvscope.collector.wire import table_key
from kvscope.storage.rows import RollupRow

_DEFAULT_KEY = table_key("GPU", 0)
_FOLD_AT = 1 << 16
"""Batches' changes held before they are summed into one."""


class SecondRollup:
    """The second being counted; `instant` hands back the rows of a second that ended."""

    def __init__(self, stream: StreamId) -> None:
        self.stream = stream
        self.second: int | None = None
        self._view: MapReader | None = None
        """The map of the last batch (what a second still open at close is read from)."""
        self._changes: list[Mapping[TableKey, Sequence[int]]] = []
        """Each batch's blocks stored and removed per table in the current second, summed at
        its end: one append per batch, and the sums run in C."""
        self._clears = 0
        self._gaps = 0

    def instant(self, view: MapReader, ts: float) -> list[RollupRow]:
        """Before a batch stamped `ts`: if it opens a new second, the rows of the one before
        (`view` is the map after that second's last batch)."""
        self._view = view
        second = int(ts)
        if second == self.second:
            return []
        rows = [] if self.second is None else self._rows(view)
        self.second = second
        return rows

    def span(self) -> Span:
        """The stamps of the current second (`int` truncates towards 0: below 0 the stamps of a
        second end at it, so any stamp there asks again)."""
        second = self.second
        if second is None or second < 0:
            return EVERY_BATCH
        return Span(second, second + 1)

    def applied(self, batch: AppliedBatch) -> None:
        self._view = batch.view
        self._gaps += batch.gaps
        changes = self._changes
        changes.append(batch.changes)
        if len(changes) >= _FOLD_AT:  # a clock stuck in one second must not grow the list
            self._changes = [_summed(changes)]

    def cleared(self) -> None:
        """An `AllBlocksCleared` in the batch being applied (restarts are not counted)."""
        self._clears += 1

    def close(self) -> list[RollupRow]:
        """The rows of the second still open (the collector is stopping)."""
        if self.second is None or self._view is None:
            return []
        rows = self._rows(self._view)
        self.second = None
        return rows

    def _rows(self, view: MapReader) -> list[RollupRow]:
        """Clears and gaps belong to the stream and are repeated on each of its rows (take the
        max over tiers, not the sum)."""
        assert self.second is not None
        stats = view.stats()
        changes = _summed(self._changes)
        rows = []
        for key in set(stats) | set(changes) or {_DEFAULT_KEY}:
            s = stats.get(key)
            stores, removes = changes.get(key, (0, 0))
            rows.append(
                RollupRow(
                    self.stream,
                    self.second,
                    key.medium,
                    key.group,
                    0 if s is None else s.blocks,
                    0 if s is None else s.hittable,
                    0 if s is None else s.orphans,
                    stores,
                    removes,
                    self._clears,
                    self._gaps,
                )
            )
        self._changes = []
        self._clears = self._gaps = 0
        return rows


def _summed(changes: list[Mapping[TableKey, Sequence[int]]]) -> dict[TableKey, tuple[int, int]]:
    """Blocks stored and removed per table over `changes`; a table only named, by events of no
    block, is left out (counts are never negative).

    One pass over each batch's few tables: a pass over all the batches per table, in C, costs
    twice as many instructions (a bound `get` and a list per batch)."""
    summed: dict[TableKey, list[int]] = {}
    get = summed.get
    for change in changes:
        for key, (stores, removes) in change.items():
            found = get(key)
            if found is None:
                summed[key] = [stores, removes]  # a copy: the batch's own list is not ours
            else:
                found[0] += stores
                found[1] += removes
    return {
        key: (stores, removes) for key, (stores, removes) in summed.items() if stores or removes
    }
