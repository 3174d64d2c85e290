"""What came back of a reset, prefix by prefix: the pre-reset cache as groups of chains, each
group followed through the recovery offsets, and the orphans a keep-running reset left.

A *group* is a root block of the `before` map (a cached block whose parent is None or not
cached; in the lab, the first block of a shared system prompt) with every block under it. Its
size is counted in blocks and tokens (blocks x block size). At each recovery offset reached
(reset ts + offset on the engine clock, measured as the writer measures its recovery points:
the map just before the first batch stamped past the offset) the group's blocks are counted
again: cached again (`blocks_back`) and hittable again (`hittable_back`, every ancestor cached).

The status rule: a group is *back* at the first offset reached at which at least 90 % of its
blocks (`BACK_SHARE`) are hittable again; its status names the bucket of that offset:
`back at +1 s` (1 s), `back at +10 s` (2 to 10 s), `back at +60 s` (20 to 60 s), `back later`
(120 or 300 s) or `not back` (by none of the offsets reached: while the recovery is partial,
not yet).

An *orphan the reset left* is a block stored after the clear whose parent, named, was not
cached when it was stored (a keep-running reset: the running requests' blocks were cleared
under them). It *rejoins* its chain at the first batch after which its parent is cached again;
it may be removed first. Both are followed batch by batch to the last offset reached. Blocks
stored under a cached parent that was evicted later are orphans too, but not the reset's: they
are counted apart (storage/reset_orphans.py).

Everything comes from the stored data only: the reset's `before` map, and the map rebuilt just
after the clear's batch (storage/history.py) fed the logged batches up to the last offset.
"""

from __future__ import annotations

import threading

from sqlalchemy import Connection, select

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearReason
from kvscope.collector.snapshot import decode_tables
from kvscope.collector.types import StreamId, TableKey
from kvscope.collector.wire import BatchDecoder
from kvscope.storage import batch_log, schema
from kvscope.storage.history import NotInStore, Position, rebuild
from kvscope.storage.reset_orphans import Orphans
from kvscope.storage.reset_prefix_types import (
    BACK_SHARE,
    FIRST_TOKENS,
    GroupPoint,
    PrefixGroup,
    ResetPrefixes,
    status_of,
)


def _chains(table: BlockTable) -> tuple[dict[int, int], set[int]]:
    """hash -> the root of its chain (a block whose parent is None or not cached), and the
    shared blocks: those with two or more leaves (cached prefixes) under them."""
    present = table.counts()
    parent_of = {h: table.parent_of(h) for h in present}
    root_of: dict[int, int] = {}
    order: list[int] = []
    """Every hash after its parent."""
    longest = len(present)
    for start in present:
        parent = parent_of[start]
        known = None if parent is None else root_of.get(parent)
        if known is not None:  # the common case: its parent came first
            root_of[start] = known
            order.append(start)
            continue
        path: list[int] = []
        h = start
        while h not in root_of:
            parent = parent_of[h]
            if parent is None or parent not in present or len(path) > longest:
                root_of[h] = h  # (past `longest`: a cycle, in hostile input; cut here)
                order.append(h)
                break
            path.append(h)
            h = parent
        root = root_of[h]
        for member in reversed(path):
            if member not in root_of:
                root_of[member] = root
                order.append(member)
    leaves = dict.fromkeys(present, 1)
    for h in order:
        if root_of[h] != h:
            leaves[parent_of[h]] = 0  # type: ignore[index]
    for h in reversed(order):
        if root_of[h] != h:
            leaves[parent_of[h]] += leaves[h]  # type: ignore[index]
    return root_of, {h for h, n in leaves.items() if n >= 2}


def _state_of(
    view: PrefixMap, members: dict[TableKey, dict[int, int]], shared: dict[TableKey, set[int]]
) -> dict[int, list[int]]:
    """Per group index: [cached again, hittable again, shared blocks hittable again]."""
    counts: dict[int, list[int]] = {}
    for key, of_group in members.items():
        table = view.tables.get(key)
        if table is None:
            continue
        # The blocks back, by a set intersection in C: after a reset most are not.
        for h in table.counts().keys() & of_group.keys():
            found = counts.setdefault(of_group[h], [0, 0, 0])
            found[0] += 1
            if table.is_hittable(h):
                found[1] += 1
                if h in shared[key]:
                    found[2] += 1
    return counts


def reset_prefixes(conn: Connection, reset_id: int) -> ResetPrefixes:
    """The groups and orphans of a stored reset (NotInStore: no such reset, or its log is
    gone)."""
    r, s = schema.resets, schema.streams
    row = conn.execute(
        select(
            r.c.id,
            r.c.stream_id,
            r.c.epoch,
            r.c.seq,
            r.c.ts,
            r.c.before,
            r.c.recovery_complete,
            r.c.reason,
            s.c.replica,
            s.c.rank,
        )
        .join(s, s.c.id == r.c.stream_id)
        .where(r.c.id == reset_id)
    ).first()
    if row is None:
        raise NotInStore(f"no reset {reset_id}")
    offsets = offsets_reached(conn, reset_id)
    before, signed = decode_tables(row.before)
    keys = sorted(before, key=lambda k: (k.medium, k.group))
    roots: list[tuple[TableKey, int]] = []
    members: dict[TableKey, dict[int, int]] = {}
    before_root: dict[TableKey, dict[int, int]] = {}
    sizes: list[int] = []
    shared: dict[TableKey, set[int]] = {}
    shared_sizes: list[int] = []
    for key in keys:
        root_of, shared[key] = _chains(before[key])
        before_root[key] = root_of
        index: dict[int, int] = {}
        of_group = members[key] = {}
        for h in sorted(root_of):
            root = root_of[h]
            group = index.get(root)
            if group is None:
                group = index[root] = len(roots)
                roots.append((key, root))
                sizes.append(0)
                shared_sizes.append(0)
            of_group[h] = group
            sizes[group] += 1
            shared_sizes[group] += h in shared[key]

    stream = StreamId(row.replica, row.rank)
    if row.reason == ClearReason.RESTART.value:
        # A new epoch from an empty map; its first batch (`seq`) is the first one followed.
        epoch, after = row.epoch + 1, row.seq - 1
        view, unknown = PrefixMap(stream), []
    else:
        epoch, after = row.epoch, row.seq
        rebuilt = rebuild(conn, Position(row.stream_id, epoch, after, row.ts), stream)
        view, unknown = rebuilt.map, rebuilt.unknown_because
    orphans = Orphans(before_root)
    orphans.start(view, row.ts)
    states: list[dict[int, list[int]]] = []
    last_ts = row.ts
    if offsets:
        decoder = BatchDecoder()
        last_instant = row.ts + offsets[-1]
        for batch in batch_log.batches_between(conn, row.stream_id, epoch, after, 2**63 - 1):
            while len(states) < len(offsets) and batch.ts > row.ts + offsets[len(states)]:
                states.append(_state_of(view, members, shared))
            if batch.ts > last_instant:
                break
            decoded = decoder.decode(batch.payload, batch.seq)
            view.apply(decoded, epoch)
            orphans.after(view, decoded.events, batch.ts)
            last_ts = batch.ts
        while len(states) < len(offsets):  # the log ends at or before the last offset
            states.append(_state_of(view, members, shared))

    groups = []
    left: dict[tuple[TableKey, int], int] = {}
    found_orphans = orphans.result()
    for orphan in found_orphans:
        if orphan.group_root is not None:
            group_key = (orphan.table, orphan.group_root)
            left[group_key] = left.get(group_key, 0) + 1
    for i, (key, root) in enumerate(roots):
        table = before[key]
        points = tuple(
            GroupPoint(offset, *state.get(i, (0, 0, 0)))
            for offset, state in zip(offsets, states, strict=True)
        )
        # One chain (nothing shared): the whole chain is what must come back.
        trunk = shared_sizes[i] or sizes[i]
        trunk_back = [p.shared_back if shared_sizes[i] else p.hittable_back for p in points]
        back = next(
            (
                p.offset_s
                for p, n in zip(points, trunk_back, strict=True)
                if n >= BACK_SHARE * trunk
            ),
            None,
        )
        tokens = table.entry(root).token_ids
        groups.append(
            PrefixGroup(
                table=key,
                root=root,
                raw_root=table.raw_hash(root),
                orphan_root=table.parent_of(root) is not None,
                first_tokens=None if tokens is None else tuple(tokens[:FIRST_TOKENS]),
                blocks=sizes[i],
                tokens=sizes[i] * table.block_size,
                shared_blocks=shared_sizes[i],
                points=points,
                back_at_s=back,
                status=status_of(back),
                orphans_left=left.get((key, root), 0),
            )
        )
    groups.sort(key=lambda g: (-g.tokens, -g.blocks, g.table.medium, g.table.group, g.root))
    return ResetPrefixes(
        reset_id=reset_id,
        ts=row.ts,
        offsets=offsets,
        complete=bool(row.recovery_complete),
        signed=signed,
        groups=tuple(groups),
        orphans=found_orphans,
        evicted_orphans=orphans.evicted_result(),
        followed_until_ts=last_ts,
        unknown_because=tuple(unknown),
    )


class PrefixesCache:
    """Computed answers by reset id, reused while the reset's offsets reached and completeness
    are what they were (a partial recovery's answer is computed again once it reaches more)."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._held: dict[int, ResetPrefixes] = {}
        self._lock = threading.Lock()
        """One computation at a time: two requests for one reset compute it once."""

    def get(self, conn: Connection, reset_id: int) -> ResetPrefixes:
        with self._lock:
            return self._get(conn, reset_id)

    def _get(self, conn: Connection, reset_id: int) -> ResetPrefixes:
        r = schema.resets
        complete = conn.execute(select(r.c.recovery_complete).where(r.c.id == reset_id)).first()
        if complete is None:
            raise NotInStore(f"no reset {reset_id}")
        offsets = offsets_reached(conn, reset_id)
        held = self._held.get(reset_id)
        if held is not None and held.offsets == offsets and held.complete == bool(complete[0]):
            return held
        fresh = reset_prefixes(conn, reset_id)
        self._held.pop(reset_id, None)
        self._held[reset_id] = fresh
        while len(self._held) > self.size:
            self._held.pop(next(iter(self._held)))
        return fresh


def offsets_reached(conn: Connection, reset_id: int) -> tuple[float, ...]:
    """The recovery offsets stored for a reset so far, ascending."""
    rr = schema.reset_recovery
    query = select(rr.c.offset_s).where(rr.c.reset_id == reset_id).order_by(rr.c.offset_s)
    return tuple(float(o) for o in conn.execute(query).scalars())
