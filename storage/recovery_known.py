"""What the store writer knows of each reset's recovery as the store holds it, so that the prefix
followers (storage/prefix_followers.py) need not read it back at each answer:

- `WrittenRecoveries`, the writer's: the recovery rows a transaction wrote that updated their
  reset, each under the lease its stream was admitted with, told to the followers as `Written`;
- `KeptOffsets`, the followers': a followed reset's offsets stored, read back once, then kept up
  with what this writer writes under the same lease. Points this writer did not write may be
  stored (one that ran before a restart, or with other offsets, or under another lease): where
  the lease is not the same, they are read back again.

Writer thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, select

from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.history import NotInStore
from kvscope.storage.reset_prefixes import offsets_reached
from kvscope.storage.rows import RecoveryRow

ResetKey = tuple[int, int, str]
"""A reset's (epoch, seq, reason), as its rows carry it."""


@dataclass(frozen=True, slots=True)
class Written:
    """What the transaction just wrote of a reset's recovery (the row updated its reset)."""

    complete: bool
    offsets: Sequence[float]
    """Its points' offsets: the store holds these and those stored before."""
    lease: int | None
    """The lease token the stream was written under (None: no leases)."""


class WrittenRecoveries:
    """A transaction's recovery rows (one per reset) that updated their reset, and the lease
    each stream was admitted under."""

    def __init__(self) -> None:
        self._rows: dict[tuple[StreamId, ResetKey], RecoveryRow] = {}
        self._leases: dict[StreamId, int] | None = None

    def begin(self, leases: dict[StreamId, int] | None) -> None:
        """A transaction's writes begin. `leases`: the lease token each stream was admitted
        under (None: no leases; a stream left out: unsure, its lease changed meanwhile)."""
        self._rows.clear()
        self._leases = leases

    def updated(self, row: RecoveryRow) -> None:
        """`row` updated its reset's row."""
        self._rows[(row.stream, row.key)] = row

    def written(self, stream: StreamId, key: ResetKey) -> Written | None:
        """What this transaction wrote of the reset's recovery, where that is known: None
        where no row of it updated the reset, or its stream's lease is unsure."""
        row = self._rows.get((stream, key))
        leases = self._leases
        if row is None or (leases is not None and stream not in leases):
            return None
        offsets = tuple(p.offset_s for p in row.points)
        return Written(row.complete, offsets, None if leases is None else leases[stream])


Known = tuple[int, int | None, tuple[float, ...]]
"""A reset's id, the lease its offsets were written under (None: no leases), its offsets."""


class KeptOffsets:
    """Per stream, a reset's offsets stored (committed) as this writer knows them: read back
    once, then kept up with what it writes (its lease the same), so that they need not be read
    again while only this writer writes that reset's points."""

    def __init__(self) -> None:
        self._reached: dict[StreamId, Known] = {}
        self._reaching: dict[StreamId, Known] = {}
        """What this transaction stored (`committed` makes it `_reached`)."""

    def begin(self) -> None:
        """A transaction begins: what one that failed stored is not stored."""
        self._reaching.clear()

    def committed(self) -> None:
        self._reached.update(self._reaching)
        self._reaching.clear()

    def forget(self) -> None:
        """A failed transaction may have rolled back offsets kept here."""
        self._reached.clear()
        self._reaching.clear()

    def drop(self, stream: StreamId) -> None:
        self._reached.pop(stream, None)
        self._reaching.pop(stream, None)

    def reset_written(self, reset_id: int) -> None:
        """A reset row was written under `reset_id`: if that id was another's (pruned, and
        SQLite gave it again, to any stream), its offsets known here are not this one's."""
        for kept in (self._reached, self._reaching):
            for other in [s for s, known in kept.items() if known[0] == reset_id]:
                del kept[other]

    def recovery(
        self, conn: Connection, stream: StreamId, reset_id: int, written: Written | None
    ) -> tuple[bool, tuple[float, ...]]:
        """Whether the reset's recovery is complete, and its offsets stored, as the store holds
        them now: read back unless this transaction wrote them (the offsets: and this writer
        knows what was stored before, read back once, since kept up with)."""
        known = self._reached.get(stream)
        if written is None:
            r = schema.resets
            found = conn.execute(select(r.c.recovery_complete).where(r.c.id == reset_id)).first()
            if found is None:
                raise NotInStore(f"no reset {reset_id}")
            complete = bool(found[0])
        else:  # the row updated the reset (it is there, locked), its figures with the rest
            complete = written.complete
        if written is not None and known is not None and known[:2] == (reset_id, written.lease):
            offsets = tuple(sorted({*known[2], *map(float, written.offsets)}))
        else:  # points may be stored that this writer did not write (before a restart)
            offsets = offsets_reached(conn, reset_id)
        newer = max((k[0] for k in (known, self._reaching.get(stream)) if k), default=0)
        if written is not None and not complete:
            if newer <= reset_id:  # a stream's newest reset is kept
                self._reaching[stream] = (reset_id, written.lease, offsets)
        elif known is not None and known[0] == reset_id:
            del self._reached[stream]
        return complete, offsets
