"""Per-second rollups of one stream, counted on the ingest thread.

A second's row holds the map at its end (the map just before the first batch stamped in a later
second: the sink's `instant` call) and what changed in it: the per-table changes each applied
batch carries, summed as they come (storage/_rollup_counts.pyx, in C), its clears and its gaps.
Nothing walks the events of a batch.
"""

from __future__ import annotations

from kvscope.collector.types import StreamId
from kvscope.storage._rollup_counts import RollupCounts, SecondCore
from kvscope.storage.rows import RollupRow


class SecondRollup(SecondCore):
    """The second being counted; `instant` hands back the rows of a second that ended, and
    `span` the stamps of the second it opened (in C, with the rows: storage/_rollup_counts.pyx)."""

    def __init__(self, stream: StreamId) -> None:
        self.stream = stream
        self.second = None
        self.counts = RollupCounts()
        """The current second's blocks stored and removed per table, and its gaps; and the map
        of the last batch (what a second still open at close is read from). The store's writer
        hands each batch to its `applied` itself: one call per batch, in C."""
        self._clears = 0

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
