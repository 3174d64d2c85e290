"""Per-second rollups of one stream, counted on the ingest thread.

Counting stores and removes per table by walking every event of every batch was most of what
the store cost the ingest thread. While a map has one table (one tier, one KV group: the usual
case) the map's own cumulative counters say the same: a batch is walked event by event only when
the map's set of tables changed under it (a new tier or group, a clear, a restart, a map loaded
after a crash).
"""

from __future__ import annotations

from kvscope.collector.block_table import BlockTable
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import MapCounters, PrefixMap
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    StreamId,
    TableKey,
)
from kvscope.collector.wire import table_key
from kvscope.storage.rows import RollupRow

_DEFAULT_KEY = table_key("GPU", 0)


class SecondRollup:
    """The second being counted; `before_batch` hands back the rows of a second that ended."""

    def __init__(self, stream: StreamId) -> None:
        self.stream = stream
        self.second: int | None = None
        self._changes: dict[TableKey, list[int]] = {}
        """Blocks stored and removed per table in the current second, as far as settled."""
        self._clears = 0
        self._gaps = 0
        self._gaps_seen = 0
        self._map: PrefixMap | None = None
        """The map of the last batch (what a second still open at close is read from)."""
        self._single: dict[TableKey, BlockTable] | None = None
        """The map's tables after the last batch, while they were exactly one (`_key`): the
        counters' growth since `_settled` is that table's. Holding the dict keeps its identity
        unique: a later map's new dict cannot be mistaken for it."""
        self._key: TableKey | None = None
        self._counters: MapCounters | None = None
        self._settled = (0, 0)
        """`_counters`' (stored_blocks, removed_blocks) already counted in `_changes`."""

    def before_batch(self, prefix_map: PrefixMap, ts: float) -> list[RollupRow]:
        """Before a batch stamped `ts`: if it opens a new second, the rows of the one before
        (the map now is the map after that second's last batch)."""
        self._map = prefix_map
        second = int(ts)
        if second == self.second:
            return []
        rows = [] if self.second is None else self._rows(prefix_map)
        self.second = second
        return rows

    def after_batch(self, ingest: StreamIngest, batch: Batch) -> None:
        tables = ingest.map.tables
        if tables is not self._single or len(tables) != 1:
            self._walk(ingest.map, batch)
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
    def _walk(self, prefix_map: PrefixMap, batch: Batch) -> None:
        """Count a batch event by event, settling what the counters owe the single table first."""
        stored = removed = 0
        per_table: dict[TableKey, list[int]] = {}
        for event in batch.events:
            if type(event) is BlocksStored or type(event) is BlocksRemoved:
                counts = per_table.get(event.table)
                if counts is None:
                    counts = per_table[event.table] = [0, 0]
                n = len(event.hashes)
                if type(event) is BlocksStored:
                    counts[0] += n
                    stored += n
                else:
                    counts[1] += n
                    removed += n
            elif type(event) is AllCleared:
                self._clears += 1
        counters = prefix_map.counters
        if counters is self._counters:
            # The counters include this batch already: the rest is the single table's.
            self._settle(counters.stored_blocks - stored, counters.removed_blocks - removed)
        else:
            self._settle()  # another map (loaded after a crash): the old one's counters
            self._counters = counters
        for key, (s, r) in per_table.items():
            self._add(key, s, r)
        self._settled = (counters.stored_blocks, counters.removed_blocks)
        tables = prefix_map.tables
        if len(tables) == 1:
            self._single, self._key = tables, next(iter(tables))
        else:
            self._single = self._key = None

    def _settle(self, stored: int | None = None, removed: int | None = None) -> None:
        """Count the counters' growth up to (`stored`, `removed`), default their values now,
        towards the single table."""
        counters = self._counters
        if counters is None:
            return
        stored = counters.stored_blocks if stored is None else stored
        removed = counters.removed_blocks if removed is None else removed
        settled_stored, settled_removed = self._settled
        if self._key is not None and (stored != settled_stored or removed != settled_removed):
            self._add(self._key, stored - settled_stored, removed - settled_removed)
        self._settled = (stored, removed)

    def _add(self, key: TableKey, stored: int, removed: int) -> None:
        counts = self._changes.get(key)
        if counts is None:
            self._changes[key] = [stored, removed]
        else:
            counts[0] += stored
            counts[1] += removed

    def _rows(self, prefix_map: PrefixMap) -> list[RollupRow]:
        """Clears and gaps belong to the stream and are repeated on each of its rows (take the
        max over tiers, not the sum)."""
        assert self.second is not None
        self._settle()
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
