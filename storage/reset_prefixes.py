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

from kvscope.storage import schema
from kvscope.storage.history import NotInStore
from kvscope.storage.reset_follower import ResetFollower
from kvscope.storage.reset_prefix_types import ResetPrefixes


def reset_prefixes(conn: Connection, reset_id: int) -> ResetPrefixes:
    """The groups and orphans of a stored reset, computed afresh from the store (NotInStore: no
    such reset, or its log is gone)."""
    complete = conn.execute(
        select(schema.resets.c.recovery_complete).where(schema.resets.c.id == reset_id)
    ).first()
    if complete is None:
        raise NotInStore(f"no reset {reset_id}")
    follower = ResetFollower(conn, reset_id)
    follower.advance(conn, offsets_reached(conn, reset_id))
    return follower.result(bool(complete[0]))


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
