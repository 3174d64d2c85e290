"""Per-second rollups of one stream, counted on the ingest thread.

Counting stores and removes per table by walking every event of every batch was most of what
the store cost the ingest thread. The map counts them itself, cumulatively per table
(`MapCounters.per_table`): a second's changes are the differences of those counters between its
ends, whatever the number of tiers and groups.
"""

from __future__ import annotations

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import MapCounters, PrefixMap
from kvscope.collector.types import StreamId, TableKey
from kvscope.collector.wire import table_key
from kvscope.storage.rows import RollupRow

_DEFAULT_KEY = table_key("GPU", 0)


class SecondRollup:
    """The second being counted; `before_batch` hands back the rows of a second that ended."""

    def __init__(self, stream: StreamId) -> None:
        self.stream = stream
        self.second: int | None = None
        self._map: PrefixMap | None = None
        """The map of the last batch (what a second still open at close is read from)."""
        self.counters: MapCounters | None = None
        """The counters `_marks` refer to: a map loaded after a crash brings new ones."""
        self._marks: dict[TableKey, tuple[int, int]] = {}
        """Each table's (stored, removed) counters as far as counted into `_changes`."""
        self._clears_mark = 0
        self._changes: dict[TableKey, list[int]] = {}
        """Blocks stored and removed per table in the current second, as far as counted."""
        self._clears = 0
        self._gaps = 0
        self._gaps_seen = 0

    def before_batch(self, prefix_map: PrefixMap, ts: float) -> list[RollupRow]:
        """Before a batch stamped `ts`: if it opens a new second, the rows of the one before
        (the map now is the map after that second's last batch). Call it too whenever the map's
        counters are not `counters`: the first map, or one loaded after a crash."""
        self._map = prefix_map
        if prefix_map.counters is not self.counters:
            self._follow(prefix_map.counters)
        second = int(ts)
        if second == self.second:
            return []
        rows = [] if self.second is None else self._rows(prefix_map)
        self.second = second
        return rows

    def after_batch(self, ingest: StreamIngest) -> None:
        self._map = ingest.map
        gaps = ingest.counters.gaps
        if gaps != self._gaps_seen:
            self._gaps += gaps - self._gaps_seen
            self._gaps_seen = gaps

    def close(self) -> list[RollupRow]:
        """The rows of the second still open (the collector is stopping)."""
        if self.second is None or self._map is None:
            return []
        rows = self._rows(self._map)
        self.second = None
        return rows

    # --- internals ----------------------------------------------------------------------------
    def _follow(self, counters: MapCounters) -> None:
        """Count from here on from another map's counters. Before a batch they hold only what
        came before (a loaded map's: the batches replayed into it, rolled up before the crash)."""
        self._count()
        self.counters = counters
        self._marks = {key: (s, r) for key, (s, r) in counters.per_table.items()}
        self._clears_mark = counters.cleared_events

    def _count(self) -> None:
        """Move what the counters grew by since the marks into this second's changes."""
        counters = self.counters
        if counters is None:
            return
        marks, changes = self._marks, self._changes
        for key, (stored, removed) in counters.per_table.items():
            mark = marks.get(key, (0, 0))
            if mark[0] != stored or mark[1] != removed:
                counts = changes.setdefault(key, [0, 0])
                counts[0] += stored - mark[0]
                counts[1] += removed - mark[1]
                marks[key] = (stored, removed)
        self._clears += counters.cleared_events - self._clears_mark
        self._clears_mark = counters.cleared_events

    def _rows(self, prefix_map: PrefixMap) -> list[RollupRow]:
        """Clears and gaps belong to the stream and are repeated on each of its rows (take the
        max over tiers, not the sum)."""
        assert self.second is not None
        self._count()
        stats = prefix_map.stats()
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
