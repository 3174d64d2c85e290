"""Following a map after a clear: how fast, and how much of what was there, comes back.

Runs on the ingest thread (it reads the live map), so each step is cheap: totals per batch, and
a pass over the pre-reset hashes only at the fixed offsets. Offsets are measured just before the
first batch past them, when the map is exactly what it was at the offset (the sink's `instant`
call, asked for at `next_instant`).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvscope.collector.sink import MapReader, TableReader
from kvscope.collector.types import TableKey

DEFAULT_OFFSETS_S = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True, slots=True)
class RecoveryPoint:
    offset_s: float
    blocks: int
    hittable: int
    orphans: int
    share_blocks_back: float
    share_tokens_back: float


@dataclass
class RecoverySummary:
    t50_s: float | None
    t90_s: float | None
    peak_orphans: int
    until_ts: float


@dataclass
class RecoveryTracker:
    """One reset's recovery, fed the map after each later batch of its stream."""

    reset_ts: float
    before_blocks: int
    before_hashes: dict[TableKey, array[int]]
    """Per table, the pre-reset hashes (`array("Q")`: 8 bytes each, probed in C)."""
    before_hittable: dict[TableKey, tuple[array[int], int]]
    """Per table, the pre-reset hittable hashes and the table's block size (their tokens)."""
    offsets: tuple[float, ...] = DEFAULT_OFFSETS_S
    points: list[RecoveryPoint] = field(default_factory=list)
    t50_s: float | None = None
    t90_s: float | None = None
    peak_orphans: int = 0
    last_ts: float = 0.0
    _next: int = 0

    @classmethod
    def start(
        cls, ts: float, tables: Mapping[TableKey, TableReader], offsets: tuple[float, ...]
    ) -> RecoveryTracker:
        # Once per clear, on the ingest thread, over the whole map: one pass over the flags
        # rather than a lookup per hash.
        hashes = {key: table.hash_array() for key, table in tables.items()}
        hittable = {
            key: (table.hittable_hash_array(), table.block_size) for key, table in tables.items()
        }
        return cls(
            reset_ts=ts,
            before_blocks=sum(len(t) for t in tables.values()),
            before_hashes=hashes,
            before_hittable=hittable,
            offsets=offsets,
            last_ts=ts,
        )

    @property
    def window_s(self) -> float:
        return self.offsets[-1] if self.offsets else 0.0

    @property
    def next_instant(self) -> float | None:
        """The engine-clock instant of the next offset to measure (None: all are)."""
        if self._next >= len(self.offsets):
            return None
        return self.reset_ts + self.offsets[self._next]

    def before_batch(self, view: MapReader, ts: float) -> list[RecoveryPoint]:
        """Called before a batch stamped `ts` is applied: the map now is the map at every
        offset this batch goes past (nothing changes between two batches)."""
        new_points = []
        while self._next < len(self.offsets) and ts > self.reset_ts + self.offsets[self._next]:
            new_points.append(self._point(self.offsets[self._next], view))
            self._next += 1
        self.points.extend(new_points)
        return new_points

    def after_batch(self, view: MapReader, ts: float) -> None:
        # Every batch while a recovery is followed: the two totals it needs, summed in line
        # (not `view.totals()`'s four, and its struct).
        blocks = orphans = 0
        for table in view.tables.values():
            blocks += len(table)
            orphans += table.orphan_count
        if orphans > self.peak_orphans:
            self.peak_orphans = orphans
        if self.before_blocks:
            if self.t50_s is None and blocks >= 0.5 * self.before_blocks:
                self.t50_s = ts - self.reset_ts
            if self.t90_s is None and blocks >= 0.9 * self.before_blocks:
                self.t90_s = ts - self.reset_ts
        self.last_ts = ts

    @property
    def done(self) -> bool:
        return self._next >= len(self.offsets)

    def summary(self) -> RecoverySummary:
        return RecoverySummary(self.t50_s, self.t90_s, self.peak_orphans, self.last_ts)

    def _point(self, offset: float, view: MapReader) -> RecoveryPoint:
        totals = view.totals()
        back = total = 0
        tokens_back = tokens_total = 0
        for key, hashes in self.before_hashes.items():
            table = view.tables.get(key)
            hittable, block_size = self.before_hittable[key]
            total += len(hashes)
            tokens_total += len(hittable) * block_size
            if table is not None:  # (a probe a hash, in C: the whole before map, each offset)
                back += table.count_cached(hashes)
                tokens_back += table.count_cached(hittable, hittable=True) * block_size
        return RecoveryPoint(
            offset_s=offset,
            blocks=totals.blocks,
            hittable=totals.hittable,
            orphans=totals.orphans,
            share_blocks_back=back / total if total else 0.0,
            share_tokens_back=tokens_back / tokens_total if tokens_total else 0.0,
        )
