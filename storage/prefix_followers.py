"""The store writer's prefix-group followers (storage/reset_follower.py): one per recovering
stream, fed at each recovery offset only the batches logged since the last, instead of rebuilding
the map after the clear and replaying the window again at every offset.

Bounded: a follower is dropped once its recovery is complete, replaced when the stream's next
reset is followed, dropped when the stream's lease moves to another collector, and at most
`cap` are held; past the cap (and after a restart of the collector or a failed transaction,
which forget them all) an offset is computed in full, as `reset_prefixes` does, and followed
again from there while there is room. Writer thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, select

from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.history import NotInStore
from kvscope.storage.reset_follower import ResetFollower
from kvscope.storage.reset_prefix_types import ResetPrefixes
from kvscope.storage.reset_prefixes import offsets_reached
from kvscope.storage.store_settings import StoreSettings


class PrefixFollowers:
    def __init__(self, cap: int = StoreSettings.prefix_followers) -> None:
        self.cap = cap
        self._held: dict[StreamId, ResetFollower] = {}
        self.replayed = 0
        """Batches applied to followers' maps, all resets and offsets together."""
        self.rebuilt = 0
        """Followers started from the store (a reset's first offset, or a fallback)."""
        self.observe: Callable[[Connection, ResetPrefixes], None] | None = None
        """Told each answer, within the writer's transaction (for tests)."""

    def held(self) -> int:
        return len(self._held)

    def forget(self) -> None:
        """A failed transaction may have rolled back batches the followers were fed."""
        self._held.clear()

    def drop(self, stream: StreamId) -> None:
        """`stream` is followed no more here (its lease moved away)."""
        self._held.pop(stream, None)

    def groups(self, conn: Connection, stream: StreamId, reset_id: int) -> ResetPrefixes:
        """The reset's answer as of the offsets stored for it now (NotInStore: as
        `reset_prefixes`)."""
        r = schema.resets
        complete = conn.execute(select(r.c.recovery_complete).where(r.c.id == reset_id)).first()
        if complete is None:
            raise NotInStore(f"no reset {reset_id}")
        offsets = offsets_reached(conn, reset_id)
        held = self._held.pop(stream, None)
        follower = held
        if follower is None or follower.reset_id != reset_id or not follower.follows(offsets):
            follower = ResetFollower(conn, reset_id)
            self.rebuilt += 1
        done = follower.replayed
        follower.advance(conn, offsets)
        self.replayed += follower.replayed - done
        # A stream recovers from its newest reset only: an older one's last row is not kept.
        newest = held if held is not None and held.reset_id > reset_id else follower
        if (newest is not follower or not complete[0]) and len(self._held) < self.cap:
            self._held[stream] = newest
        found = follower.result(bool(complete[0]))
        if self.observe is not None:
            self.observe(conn, found)
        return found
