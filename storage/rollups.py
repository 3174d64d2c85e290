"""Per-second rollups of one stream, counted on the ingest thread.

A second's row holds the map at its end (the map just before the first batch stamped in a later
second: the sink's `instant` call) and what changed in it: the per-table changes each applied
batch carries, summed as they come (storage/_rollup_counts.pyx, in C), its clears and its gaps.
Nothing walks the events of a batch.
"""

from __future__ import annotations

from kvscope.collector.sink import EVERY_BATCH, MapReader, Span
from kvscope.collector.types import StreamId
from kvscope.collector.wire import table_key
from kvscope.storage._rollup_counts import RollupCounts
from kvscope.storage.rows import RollupRow

_DEFAULT_KEY = table_key("GPU", 0)


class SecondRollup:
    """The second being counted; `instant` hands back the rows of a second that ended."""

    def __init__(self, stream: StreamId) -> None:
        self.stream = stream
        self.second: int | None = None
        self.counts = RollupCounts()
        """The current second's blocks stored and removed per table, and its gaps; and the map
        of the last batch (what a second still open at close is read from). The store's writer
        hands each batch to its `applied` itself: one call per batch, in C."""
        self._clears = 0

    def instant(self, view: MapReader, ts: float) -> list[RollupRow]:
        """Before a batch stamped `ts`: if it opens a new second, the rows of the one before
        (`view` is the map after that second's last batch)."""
        self.counts.view = view
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
        # Float bounds: the collector compares each batch's stamp with them, and a float
        # compared with an int past 2**30 converts it each time.
        return Span(float(second), float(second + 1))

    def cleared(self) -> None:
        """An `AllBlocksCleared` in the batch being applied (restarts are not counted)."""
        self._clears += 1

    def close(self) -> list[RollupRow]:
        """The rows of the second still open (the collector is stopping)."""
        view = self.counts.view
        if self.second is None or view is None:
            return []
        rows = self._rows(view)
        self.second = None
        return rows

    def _rows(self, view: MapReader) -> list[RollupRow]:
        """Clears and gaps belong to the stream and are repeated on each of its rows (take the
        max over tiers, not the sum)."""
        assert self.second is not None
        stats = view.stats()
        changes, gaps = self.counts.take()
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
                    gaps,
                )
            )
        self._clears = 0
        return rows
