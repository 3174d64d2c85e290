"""Per-second rollups of one stream, counted on the ingest thread.

A second's row holds the map at its end (the map just before the first batch stamped in a later
second: the sink's `instant` call) and what changed in it: the per-table changes each applied
batch carries, summed, its clears and its gaps. Nothing walks the events of a batch.
"""

from __future__ import annotations

from kvscope.collector.sink import EVERY_BATCH, AppliedBatch, MapReader, Span
from kvscope.collector.types import StreamId, TableKey
from kvscope.collector.wire import table_key
from kvscope.storage.rows import RollupRow

_DEFAULT_KEY = table_key("GPU", 0)


class SecondRollup:
    """The second being counted; `instant` hands back the rows of a second that ended."""

    def __init__(self, stream: StreamId) -> None:
        self.stream = stream
        self.second: int | None = None
        self._view: MapReader | None = None
        """The map of the last batch (what a second still open at close is read from)."""
        self._changes: dict[TableKey, list[int]] = {}
        """Blocks stored and removed per table in the current second."""
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
        for key, counts in batch.changes.items():
            mine = changes.get(key)
            if mine is not None:
                mine[0] += counts[0]
                mine[1] += counts[1]
            elif counts[0] or counts[1]:  # a table only named, by events of no block, is no row
                changes[key] = [counts[0], counts[1]]

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
        rows = []
        for key in set(stats) | set(self._changes) or {_DEFAULT_KEY}:
            s = stats.get(key)
            stores, removes = self._changes.get(key, (0, 0))
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
        self._changes = {}
        self._clears = self._gaps = 0
        return rows
