"""The store writer's prefix-group followers (storage/reset_follower.py): one per recovering
stream, fed at each recovery offset only the batches logged since the last, instead of rebuilding
the map after the clear and replaying the window again at every offset.

Fed from memory: the writer hands over each transaction's rows as it writes them (`logged`), and
the batches of a stream with a follower (or a reset not answered yet) are held until a follower
has applied them (storage/held_log.py), so that the chunks just written are not read back. The
store is read only where they are not held: a follower started anew, past the bound, after a
restart of the collector or a failed transaction, or past `hold_bytes`; the batches read then
are held from there on.

Bounded by memory, not by count: a fleet's resets in flight are as many as its replicas that
reset within a recovery window, and each follower costs about its `before` map and the map it
follows (`ResetFollower.nbytes`). A follower is dropped once its recovery is complete, replaced
when the stream's next reset is followed, dropped when the stream's lease moves to another
collector, and held only while all held fit in `follow_bytes` (and, if set, number at most
`cap`); past that (counted: `turned_away`), and after a restart of the collector or a failed
transaction, which forget them all, an offset is computed in full, as `reset_prefixes` does,
and followed again from there while there is room.

An answer is as of the recovery the store holds: what the transaction wrote of it (`Written`)
is passed in, not read back, where it is known to be all of it; the offsets stored before are
read back once per reset and kept up with (storage/recovery_known.py).

Each answer is written (`store`) as what changed since the last one this stream's follower
wrote, once that one is known committed (storage/prefix_groups_store.py). Writer thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from kvscope.collector.types import StreamId
from kvscope.storage.held_log import HeldLog
from kvscope.storage.history import NotInStore
from kvscope.storage.prefix_groups_store import StoredGroups, write_prefix_groups
from kvscope.storage.recovery_known import KeptOffsets, Written
from kvscope.storage.reset_follower import BeforeCopy, ResetFollower, follow_start
from kvscope.storage.reset_prefix_types import ResetPrefixes
from kvscope.storage.rows import LogRow, ResetRow, Row
from kvscope.storage.store_settings import StoreSettings

HOLD_BYTES = 256 << 20
"""The most payload bytes held for all followers: past it the largest logs are let go (their
followers read the store)."""


class PrefixFollowers:
    def __init__(
        self,
        cap: int | None = StoreSettings.prefix_followers,
        hold_bytes: int = HOLD_BYTES,
        follow_bytes: int = StoreSettings.prefix_follower_bytes,
    ) -> None:
        self.cap = cap
        self.hold_bytes = hold_bytes
        self.follow_bytes = follow_bytes
        self._held: dict[StreamId, ResetFollower] = {}
        self._logs: dict[StreamId, HeldLog] = {}
        self._copies: dict[StreamId, BeforeCopy] = {}
        """Each stream's newest reset's `before` map, until its follower is made."""
        self._stored: dict[StreamId, StoredGroups] = {}
        """What the held follower's reset has in `reset_prefix_groups`, committed."""
        self._writing: dict[StreamId, StoredGroups] = {}
        """What this transaction wrote (`committed` makes it `_stored`)."""
        self.turned_away = 0
        """Answers whose follower was not held for want of room (the next is computed in
        full): a fleet's resets in flight past `follow_bytes` or `cap`."""
        self.replayed = 0
        """Batches applied to followers' maps, all resets and offsets together."""
        self.rebuilt = 0
        """Followers started from the store (a reset's first offset, or a fallback)."""
        self.read_back = 0
        """Advances fed from the store (the batches were not held)."""
        self.offsets = KeptOffsets()
        """Each followed reset's offsets stored, as this writer knows them."""
        self.observe: Callable[[Connection, ResetPrefixes], None] | None = None
        """Told each answer, within the writer's transaction (for tests)."""

    def held(self) -> int:
        return len(self._held)

    def held_bytes(self) -> int:
        logs = sum(log.nbytes for log in self._logs.values())
        return logs + sum(copy.before.nbytes for copy in self._copies.values())

    def follower_bytes(self) -> int:
        """About what the held followers take (their logs aside)."""
        return sum(follower.nbytes() for follower in self._held.values())

    def forget(self) -> None:
        """A failed transaction may have rolled back batches the followers were fed, and the
        groups they wrote."""
        self._held.clear()
        self._logs.clear()
        self._copies.clear()
        self._stored.clear()
        self._writing.clear()
        self.offsets.forget()

    def drop(self, stream: StreamId) -> None:
        """`stream` is followed no more here (its lease moved away)."""
        self._held.pop(stream, None)
        self._logs.pop(stream, None)
        self._copies.pop(stream, None)
        self._stored.pop(stream, None)
        self._writing.pop(stream, None)
        self.offsets.drop(stream)

    def store(
        self, conn: Connection, stream: StreamId, reset_id: int, recovery: Written | None = None
    ) -> ResetPrefixes:
        """`groups`, written to `reset_prefix_groups` (and its figures to `resets`): only what
        differs from the last answer this stream's follower wrote, when that one committed."""
        found = self.groups(conn, stream, reset_id, recovery)
        written = write_prefix_groups(conn, reset_id, found, self._stored.get(stream))
        held = self._held.get(stream)
        if held is not None and held.reset_id == reset_id:
            self._writing[stream] = written
        else:
            self._stored.pop(stream, None)
        return found

    def committed(self) -> None:
        """The transaction that wrote the last answers landed."""
        self._stored.update(self._writing)
        self._writing.clear()
        self.offsets.committed()

    def reset_written(self, reset_id: int) -> None:
        """A reset row was written under `reset_id` (`KeptOffsets.reset_written`)."""
        self.offsets.reset_written(reset_id)

    def logged(self, ordered: Sequence[Row], log: Sequence[LogRow]) -> None:
        """A transaction's rows as it writes them (`ordered`: its rare rows, `log`: its
        batches), before it asks for any groups: a reset's stream is held from its clear on."""
        self._writing.clear()  # a transaction begins: what one that failed wrote is not stored
        self.offsets.begin()
        logs = self._logs
        if self.cap != 0:
            for row in ordered:
                if type(row) is not ResetRow:
                    continue
                self._copies.pop(row.stream, None)  # a stream follows its newest reset only
                if self.held_bytes() + row.before.nbytes <= self.hold_bytes:
                    self._copies[row.stream] = BeforeCopy(row.key, row.before)
                epoch, after = follow_start(*row.key)
                have = logs.get(row.stream)
                # A log held from before covers the new reset (and the older one's last row).
                if have is None or have.epoch != epoch or have.after > after:
                    logs[row.stream] = HeldLog(epoch, after)
        if not logs:
            return
        for row in log:
            held = logs.get(row[0])
            if held is not None and row[1] == held.epoch and not held.add(row):
                del logs[row[0]]  # not known any more: read from the store
        if len(logs) and self.held_bytes() > self.hold_bytes:
            for stream in sorted(logs, key=lambda s: logs[s].nbytes, reverse=True):
                del logs[stream]
                if self.held_bytes() <= self.hold_bytes:
                    break

    def groups(
        self, conn: Connection, stream: StreamId, reset_id: int, written: Written | None = None
    ) -> ResetPrefixes:
        """The reset's answer as of the offsets stored for it now (NotInStore: as
        `reset_prefixes`). `written`: what this transaction wrote of its recovery, which the
        store holds now (its offsets beside those stored before)."""
        complete, offsets = self.offsets.recovery(conn, stream, reset_id, written)
        held = self._held.pop(stream, None)
        follower = held
        if follower is None or follower.reset_id != reset_id or not follower.follows(offsets):
            try:
                follower = ResetFollower(conn, reset_id, self._copies.get(stream))
                if follower.used_copy:  # (an older reset's follower leaves the newer's copy)
                    del self._copies[stream]
            except NotInStore:
                self._logs.pop(stream, None)  # never followed: its batches need not be held
                raise
            self.rebuilt += 1
        log = self._logs.get(stream)
        batches = None if log is None else log.since(follower.epoch, follower.after)
        self.read_back += batches is None and bool(offsets)
        done = follower.replayed
        left = follower.advance(conn, offsets, batches)
        self.replayed += follower.replayed - done
        # A stream recovers from its newest reset only: an older one's last row is not kept.
        newest = held if held is not None and held.reset_id > reset_id else follower
        if newest is not follower or not complete:
            if self._room_for(newest):
                self._held[stream] = newest
            else:
                self.turned_away += 1
        if newest is follower and stream in self._held:
            if log is not None and batches is not None:
                log.trim(follower.after)
            elif offsets:  # what was read back past the last offset is the log from here on
                self._logs[stream] = HeldLog.read_back(stream, follower.epoch, follower.after, left)
            else:  # nothing was read: what the store holds past `after` is not known here
                self._logs.pop(stream, None)
        elif stream not in self._held:
            self._logs.pop(stream, None)
        found = follower.result(complete)
        if self.observe is not None:
            self.observe(conn, found)
        return found

    def _room_for(self, follower: ResetFollower) -> bool:
        """Whether `follower` may be held beside the others (the stream's own is out now)."""
        if self.cap is not None and len(self._held) >= self.cap:
            return False
        return self.follower_bytes() + follower.nbytes() <= self.follow_bytes
