"""One reset's prefix groups followed through its recovery offsets (storage/reset_prefixes.py
says what they are): the `before` map's groups computed once, the map rebuilt just after the
clear fed the logged batches, each batch once however many offsets are reached. The full
rebuild (`reset_prefixes`) is a fresh follower fed to the last offset; the store writer keeps
one per recovering stream and feeds it only the batches logged since (storage/prefix_followers.py).
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Iterator, Mapping
from typing import NamedTuple, TypeAlias, cast

from sqlalchemy import Connection, select

from kvscope.collector._replay import replay
from kvscope.collector._slot_map import SlotMap
from kvscope.collector._table_chains import chain_groups
from kvscope.collector._table_counts import add_group_counts
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearReason
from kvscope.collector.snapshot import decode_tables
from kvscope.collector.types import StreamId, TableKey
from kvscope.collector.wire import BatchDecoder
from kvscope.storage import batch_log, schema
from kvscope.storage._frozen_new import frozen_new
from kvscope.storage._reset_orphans import follow_batches
from kvscope.storage.history import NotInStore, Position, unknown_because
from kvscope.storage.log_chunks import LoggedBatch
from kvscope.storage.reset_orphans import Orphans
from kvscope.storage.reset_prefix_types import (
    BACK_SHARE,
    FIRST_TOKENS,
    GroupPoint,
    PrefixGroup,
    ResetOrphan,
    ResetPrefixes,
    status_of,
)
from kvscope.storage.rows import BeforeMap, LogRow

_State: TypeAlias = "array[int]"
_GROUP_FIELDS = tuple(f.name for f in dataclasses.fields(PrefixGroup))
BEFORE_GROUP_BYTES = 2000
"""What a follower holds per group of the `before` map besides the marks' slot maps (which say
their own bytes): its root, sizes, head (a `PrefixGroup` with its first tokens), place in an
answer's order, points list and group in the last answer (tracemalloc;
tests/test_reset_follower_bytes.py checks it)."""
FOLLOWED_BLOCK_BYTES = 60
"""What it holds per block of the map it follows (its table)."""
TABLE_BYTES = 128 << 10
"""And per table of it, however few its blocks: the columns' first room (the tokens' first
step is thousands of blocks)."""
CHILD_BYTES = 140
"""Per block in the orphans' record of what was stored under what (`Orphans.children`: every
block stored since the clear, evicted or not)."""
ORPHAN_BYTES = 800
"""And per orphan recorded: its entry, and while it is open the indexes to it (all measured
as above, tests/test_reset_follower_bytes.py)."""


def _state_of(view: PrefixMap, marks: dict[TableKey, SlotMap], groups: int) -> _State:
    """Per group index `g`: [3g] cached again, [3g + 1] hittable again, [3g + 2] shared blocks
    hittable again."""
    counts = array("i", bytes(12 * groups))
    for key, of_table in marks.items():
        table = view.tables.get(key)
        if table is not None:
            add_group_counts(table, of_table, counts)
    return counts


class BeforeCopy(NamedTuple):
    """A reset's `before` map as the store's writer holds it (the cleared tables), under its
    `ResetRow.key`: a follower made soon after reads it, not the snapshot just stored."""

    key: tuple[int, int, str]
    before: BeforeMap


class ResetFollower:
    """The groups of one reset and the map after its clear, fed batch by batch. Exact for any
    offsets that extend the ones it was fed (offsets are reached in order)."""

    def __init__(self, conn: Connection, reset_id: int, copy: BeforeCopy | None = None) -> None:
        """NotInStore: no such reset, or its log is gone. `copy`: the `before` map as the
        writer held it, if it still does (else it is read back from the store)."""
        r, s = schema.resets, schema.streams
        row = conn.execute(
            select(
                r.c.stream_id,
                r.c.epoch,
                r.c.seq,
                r.c.ts,
                r.c.reason,
                s.c.replica,
                s.c.rank,
            )
            .join(s, s.c.id == r.c.stream_id)
            .where(r.c.id == reset_id)
        ).first()
        if row is None:
            raise NotInStore(f"no reset {reset_id}")
        self.reset_id = reset_id
        self.stream_id: int = row.stream_id
        self.ts: float = row.ts
        self.key: tuple[int, int, str] = (row.epoch, row.seq, row.reason)
        """The reset's `ResetRow.key`."""
        self.used_copy = False
        """Whether it read `copy` (else the stored snapshot)."""
        if copy is not None and copy.key == self.key:
            # A map's tables are `BlockTable`s (collector/prefix_map.py); only read here.
            before = cast(Mapping[TableKey, BlockTable], copy.before.tables)
            self.signed = copy.before.signed
            self.used_copy = True
        else:
            stored = conn.execute(select(r.c.before).where(r.c.id == reset_id)).scalar_one()
            before, self.signed = decode_tables(stored)
        self._take_before(before)
        stream = StreamId(row.replica, row.rank)
        restart = row.reason == ClearReason.RESTART.value
        clear = batch_log.batch_at(conn, row.stream_id, row.epoch + restart, row.seq)
        if clear is None:
            # The batch that cleared the map (a restart's first) is where following starts:
            # without it (pruned, or dropped in an outage) the map after the clear is unknown.
            raise NotInStore(f"reset {reset_id}: its clear's batch (seq {row.seq}) is not stored")
        self.epoch, self.after = follow_start(row.epoch, row.seq, row.reason)
        if restart:
            self.view, self.unknown = PrefixMap(stream), []
        else:
            self.view = map_after_clear(stream, self.epoch, clear)
            position = Position(row.stream_id, self.epoch, self.after, row.ts)
            self.unknown = unknown_because(conn, position)
        self.orphans = Orphans(self._root_before)
        self.orphans.start(self.view, row.ts)
        self.offsets: tuple[float, ...] = ()
        self.states: list[_State] = []
        """Per offset passed by a batch: the map just before that batch."""
        self.last_ts = row.ts
        self.replayed = 0
        """Batches applied so far (each once)."""
        self._decoder = BatchDecoder()
        self._fed: tuple[tuple[float, ...], int, int] | None = None
        self._groups: tuple[PrefixGroup, ...] = ()
        """The last answer's groups, and the offsets, batches and states they were made of."""

    def _take_before(self, before: Mapping[TableKey, BlockTable]) -> None:
        """What it keeps of the `before` map: its groups (each block's mark, each group's root,
        sizes and head), not the map itself."""
        self.roots: list[tuple[TableKey, int]] = []
        self.marks: dict[TableKey, SlotMap] = {}
        """hash -> its group's index in `roots` * 2, plus 1 if it is shared, per table."""
        self.sizes: list[int] = []
        self.shared_sizes: list[int] = []
        for key in sorted(before, key=lambda k: (k.medium, k.group)):
            marks, roots, sizes, shared_sizes = chain_groups(before[key], len(self.roots))
            self.marks[key] = marks
            self.roots += [(key, root) for root in roots]
            self.sizes += sizes
            self.shared_sizes += shared_sizes
        self._heads = [_head(before[key], key, root) for key, root in self.roots]
        self._block_size = {key: table.block_size for key, table in before.items()}
        # The groups' order in an answer (largest first): their sizes do not change.
        self._answer_order = sorted(
            range(len(self.roots)),
            key=lambda i: (
                -self.sizes[i] * self._block_size[self.roots[i][0]],
                -self.sizes[i],
                self.roots[i][0].medium,
                self.roots[i][0].group,
                self.roots[i][1],
            ),
        )
        self._points: list[list[GroupPoint]] = [[] for _ in self.roots]
        """Per group, its points at the first `_pointed` offsets (`_settle_points`)."""
        self._pointed = 0
        # One chain (nothing shared): the whole chain is what must come back.
        self._at_least = [
            BACK_SHARE * (s or n) for n, s in zip(self.sizes, self.shared_sizes, strict=True)
        ]
        self._back: list[float | None] = [None] * len(self.roots)
        """Per group, the first of its settled points it was back at (those do not change:
        an answer scans only the points after them)."""
        self.before_bytes = sum(m.nbytes() for m in self.marks.values())
        self.before_bytes += BEFORE_GROUP_BYTES * len(self.roots)
        """About what it holds of the `before` map: the marks' slot maps, and per group."""

    def nbytes(self) -> int:
        """About the memory it holds: what it keeps of the `before` map, the map it follows
        (with the orphans' record of what was stored under what) per block of it now, and the
        orphans recorded."""
        tables = self.view.tables.values()
        followed = sum(len(table) for table in tables)
        orphans = self.orphans
        recorded = len(orphans.found) + len(orphans.evicted)
        return (
            self.before_bytes
            + TABLE_BYTES * len(tables)
            + FOLLOWED_BLOCK_BYTES * followed
            + CHILD_BYTES * orphans.children
            + ORPHAN_BYTES * recorded
        )

    def _root_before(self, key: TableKey, block: int) -> int | None:
        """The root of `block`'s group in the before map (None: it was not cached)."""
        marks = self.marks.get(key)
        mark = None if marks is None else marks.get(block)
        return None if mark is None else self.roots[mark >> 1][1]

    def follows(self, offsets: tuple[float, ...]) -> bool:
        """Whether `offsets` extend those fed so far (else only a fresh follower is exact)."""
        return offsets[: len(self.offsets)] == self.offsets

    def advance(
        self,
        conn: Connection,
        offsets: tuple[float, ...],
        held: Iterator[LogRow] | None = None,
    ) -> Iterator[LoggedBatch]:
        """Feeds the batches logged since the last call, up to the last offset of `offsets`:
        `held` (every batch of the epoch logged past `after`, as the writer wrote them), else
        those read back from the store. Returns the batches read back and left (past the last
        offset; none when `held`: the writer holds them)."""
        assert self.follows(offsets)
        self.offsets = offsets
        if not offsets:
            return iter(())
        last_instant = self.ts + offsets[-1]
        # In Cython (storage/_reset_orphans.pyx): every batch a follower replays goes through it.
        if held is not None:
            follow_batches(self, held, last_instant, True)
            return iter(())
        batches = batch_log.batches_between(conn, self.stream_id, self.epoch, self.after, 2**63 - 1)
        left = follow_batches(self, batches, last_instant, False)
        return iter(()) if left is None else left

    def _next_instant(self) -> float:
        """The instant past which the next offset's state is taken (inf: all are)."""
        n = len(self.states)
        return self.ts + self.offsets[n] if n < len(self.offsets) else math.inf

    def _state(self) -> _State:
        return _state_of(self.view, self.marks, len(self.roots))

    def result(self, complete: bool) -> ResetPrefixes:
        """The answer as of the offsets fed; those no batch has passed yet: the map now."""
        found_orphans = self.orphans.result()
        # Asked again with nothing fed since (a recovery row that reached no new offset: t50 or
        # t90 known, the window complete), the groups are the last answer's.
        fed = (self.offsets, self.replayed, len(self.states))
        if fed != self._fed:
            self._groups = self._make_groups(found_orphans)
            self._fed = fed
        return ResetPrefixes(
            reset_id=self.reset_id,
            ts=self.ts,
            offsets=self.offsets,
            complete=complete,
            signed=self.signed,
            groups=self._groups,
            orphans=found_orphans,
            evicted_orphans=self.orphans.evicted_result(),
            followed_until_ts=self.last_ts,
            unknown_because=tuple(self.unknown),
        )

    def _make_groups(self, found_orphans: tuple[ResetOrphan, ...]) -> tuple[PrefixGroup, ...]:
        states = self.states[: len(self.offsets)]
        while len(states) < len(self.offsets):  # the log ends at or before the offset
            states.append(self._state())
        self._settle_points()
        fresh = states[self._pointed :]
        left: dict[tuple[TableKey, int], int] = {}
        for orphan in found_orphans:
            if orphan.group_root is not None:
                group_key = (orphan.table, orphan.group_root)
                left[group_key] = left.get(group_key, 0) + 1
        roots = self.roots
        return tuple(
            self._group(i, roots[i][0], fresh, left.get(roots[i], 0) if left else 0)
            for i in self._answer_order
        )

    def _settle_points(self) -> None:
        """Each group's points at the offsets a batch has passed, made once: those states do
        not change, and an answer is made at every offset reached."""
        while self._pointed < min(len(self.states), len(self.offsets)):
            offset, state = self.offsets[self._pointed], self.states[self._pointed]
            nothing = GroupPoint(offset, 0, 0, 0)  # (shared: most groups have nothing back)
            backs, at_least, shared = self._back, self._at_least, self.shared_sizes
            for i, points in enumerate(self._points):
                j = 3 * i
                blocks = state[j]
                points.append(
                    GroupPoint(offset, blocks, state[j + 1], state[j + 2]) if blocks else nothing
                )
                came = (state[j + 2] if shared[i] else state[j + 1]) if blocks else 0
                if backs[i] is None and came >= at_least[i]:
                    backs[i] = offset
            self._pointed += 1

    def _group(self, i: int, key: TableKey, fresh: list[_State], orphans_left: int) -> PrefixGroup:
        """Group `i`'s answer: its settled points, and those of `fresh` (the states at the
        offsets after them: the map now)."""
        size, shared_size = self.sizes[i], self.shared_sizes[i]
        j = 3 * i
        points = tuple(self._points[i])
        back = self._back[i]
        if fresh:
            offsets = self.offsets[self._pointed :]
            points += tuple(
                GroupPoint(offset, state[j], state[j + 1], state[j + 2])
                for offset, state in zip(offsets, fresh, strict=True)
            )
            if back is None:
                k, at_least = (j + 2 if shared_size else j + 1), self._at_least[i]
                for offset, state in zip(offsets, fresh, strict=True):
                    if state[k] >= at_least:
                        back = offset
                        break
        head = self._heads[i]
        # `PrefixGroup(...)`, made in C: an answer makes one per group, and a frozen
        # dataclass's `__init__` sets each field through a Python call.
        values = (
            head.table,
            head.root,
            head.raw_root,
            head.orphan_root,
            head.first_tokens,
            size,
            size * self._block_size[key],
            shared_size,
            points,
            back,
            status_of(back),
            orphans_left,
        )
        return frozen_new(PrefixGroup, _GROUP_FIELDS, values)


def map_after_clear(stream: StreamId, epoch: int, clear: LoggedBatch) -> PrefixMap:
    """The map just after an `all_blocks_cleared`'s batch: that batch alone applied to an
    empty map. The clear empties every table, so what came before it (a checkpoint and the
    batches since, which `rebuild` would restore and replay) leaves nothing behind; only the
    events after the clear in its batch do."""
    view = PrefixMap(stream)
    replay(view, iter(((clear.seq, clear.payload),)), epoch)
    return view


def follow_start(epoch: int, seq: int, reason: str) -> tuple[int, int]:
    """(epoch, seq) of the last batch not followed: a reset's clear's batch, or, a restart's
    (a new epoch from an empty map), the one before it (its first batch is followed)."""
    if reason == ClearReason.RESTART.value:
        return epoch + 1, seq - 1
    return epoch, seq


def _head(table: BlockTable, key: TableKey, root: int) -> PrefixGroup:
    """A group's root as the before map held it (its counts filled in per answer)."""
    tokens = table.entry(root).token_ids
    return PrefixGroup(
        table=key,
        root=root,
        raw_root=table.raw_hash(root),
        orphan_root=table.parent_of(root) is not None,
        first_tokens=None if tokens is None else tuple(tokens[:FIRST_TOKENS]),
        blocks=0,
        tokens=0,
        shared_blocks=0,
        points=(),
        back_at_s=None,
        status=status_of(None),
        orphans_left=0,
    )
