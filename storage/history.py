"""Reading the store: the map of any stream at any past instant, and whether it is known whole.

A map is rebuilt from the newest checkpoint at or before the instant plus the logged batches
after it, through the same decoder checks and table writes as live traffic (fused, without the
objects between: collector/_replay.pyx), so it is the map the collector held at that instant,
hash for hash. Whether that map was complete is said too: a degraded or incomplete interval
covering the instant makes it unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from kvscope.collector._replay import replay
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import decode_map
from kvscope.collector.snapshot_delta import decode_delta_map
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.checkpoint_blocks import stored_blocks
from kvscope.storage.log_known_sql import offered
from kvscope.storage.not_in_store import NotInStore as NotInStore


@dataclass(frozen=True)
class Position:
    """A point in a stream's history: after applying batch `seq` of `epoch`."""

    stream_id: int
    epoch: int
    seq: int
    ts: float
    at: float | None = None
    """The instant asked for, when asked by time (the batch at `seq` may be older)."""


@dataclass
class RebuiltMap:
    map: PrefixMap
    position: Position
    from_checkpoint_seq: int | None
    batches_replayed: int
    unknown_because: list[str]
    """Degraded or incomplete intervals covering the instant: the map may be incomplete."""


def stream_id(conn: Connection, replica: str, rank: int = 0) -> int:
    t = schema.streams
    found = conn.execute(
        select(t.c.id).where(t.c.replica == replica, t.c.rank == rank)
    ).scalar_one_or_none()
    if found is None:
        raise NotInStore(f"no stream {replica}/dp{rank} in the store")
    return int(found)


def position_at_seq(conn: Connection, sid: int, seq: int, epoch: int | None = None) -> Position:
    """After batch `seq` (of `epoch`, default the latest epoch that has it)."""
    if epoch is None:
        held = batch_log.held_at(conn, sid, seq)
        if not held:
            raise NotInStore(_not_stored(conn, sid, None, seq))
        return Position(sid, held[0].epoch, seq, held[0].stamp.ts)
    found = batch_log.stamp_at(conn, sid, epoch, seq)
    if found is not None:
        return Position(sid, epoch, seq, found.ts)
    checkpoint = _checkpoint_at(conn, sid, epoch, seq)
    if checkpoint is not None:  # the log before it pruned, the checkpoint kept
        return Position(sid, epoch, seq, checkpoint)
    raise NotInStore(_not_stored(conn, sid, epoch, seq))


def _checkpoint_at(conn: Connection, sid: int, epoch: int, seq: int) -> float | None:
    c = schema.checkpoints
    return conn.execute(
        select(c.c.ts).where(c.c.stream_id == sid, c.c.epoch == epoch, c.c.seq == seq)
    ).scalar_one_or_none()


def _not_stored(conn: Connection, sid: int, epoch: int | None, seq: int) -> str:
    """Why batch `seq` is not in the store: a hole the store recorded (a gap not recovered, an
    overflow), or simply outside what it holds. The map after it is unknown either way."""
    t = schema.intervals
    query = select(t.c.kind, t.c.to_seq, t.c.detail).where(
        t.c.stream_id == sid,
        t.c.kind.in_(("degraded", "incomplete")),
        t.c.from_seq <= seq,
    )
    if epoch is not None:
        query = query.where(t.c.epoch == epoch)
    holes = [
        f"{row.kind}: {row.detail}"
        for row in conn.execute(query.order_by(t.c.from_ts.desc()))
        # incomplete: the batches from_seq..to_seq were dropped; degraded: the map is unknown
        # from from_seq until the clear at to_seq
        if row.to_seq is None
        or (seq <= row.to_seq if row.kind == "incomplete" else seq < row.to_seq)
    ]
    where = "" if epoch is None else f" of epoch {epoch}"
    because = f" (a hole: {holes[0]})" if holes else ""
    return f"seq {seq}{where} is not stored{because}: the map after it is unknown"


def position_at_time(conn: Connection, sid: int, at: float) -> Position:
    """After the last batch stamped at or before `at` (engine time).

    Checkpoints count as batches here: retention may have pruned the log up to one.
    """
    candidates = []
    logged = batch_log.stamped_last_before(conn, sid, at)
    if logged is not None:
        candidates.append((logged.stamp.ts, logged.epoch, logged.stamp.seq))
    c = schema.checkpoints
    checkpoint = conn.execute(
        select(c.c.ts, c.c.epoch, c.c.seq)
        .where(c.c.stream_id == sid, c.c.ts <= at)
        .order_by(c.c.ts.desc(), c.c.epoch.desc(), c.c.seq.desc())
        .limit(1)
    ).first()
    if checkpoint is not None:
        candidates.append(tuple(checkpoint))
    if not candidates:
        first = batch_log.first_ts(conn, sid)
        retained = "nothing is stored" if first is None else f"the log starts at ts {first:.3f}"
        raise NotInStore(f"no batch at or before ts {at:.3f}: {retained}")
    ts, epoch, seq = max(candidates)
    return Position(sid, epoch, seq, ts, at)


def rebuild(conn: Connection, position: Position, stream: StreamId) -> RebuiltMap:
    c = schema.checkpoints
    checkpoint = conn.execute(
        select(c.c.seq, c.c.snapshot, c.c.key_seq)
        .where(c.c.stream_id == position.stream_id, c.c.epoch == position.epoch)
        .where(c.c.seq <= position.seq)
        .order_by(c.c.seq.desc())
        .limit(1)
    ).first()
    if checkpoint is not None:
        prefix_map = _checkpoint_map(conn, position, checkpoint, stream)
        after = checkpoint.seq
    else:
        prefix_map = PrefixMap(stream)
        after = -1
    # As decode + apply of each batch, without the objects between (collector/_replay.pyx).
    # The chunks after the checkpoint may name its hashes (log chunk format 6): offered here.
    with offered(position.stream_id, position.epoch, after, prefix_map.tables):
        replayed = replay(
            prefix_map,
            batch_log.payloads_between(
                conn, position.stream_id, position.epoch, after, position.seq
            ),
            position.epoch,
        )
    return RebuiltMap(
        map=prefix_map,
        position=position,
        from_checkpoint_seq=None if checkpoint is None else checkpoint.seq,
        batches_replayed=replayed,
        unknown_because=unknown_because(conn, position),
    )


def _checkpoint_map(conn: Connection, position: Position, row: Any, stream: StreamId) -> PrefixMap:
    """The map a checkpoint holds: a key alone, or a delta read with its key."""
    if row.key_seq is None:
        return decode_map(row.snapshot, stream, stored_blocks(conn, position.stream_id))
    c = schema.checkpoints
    key = conn.execute(
        select(c.c.snapshot).where(
            c.c.stream_id == position.stream_id,
            c.c.epoch == position.epoch,
            c.c.seq == row.key_seq,
        )
    ).scalar_one_or_none()
    if key is None:
        raise NotInStore(
            f"the checkpoint at seq {row.seq} is a delta on the one at seq {row.key_seq}, "
            "which is not stored: the map cannot be known"
        )
    return decode_delta_map(row.snapshot, key, stream)


def unknown_because(conn: Connection, position: Position) -> list[str]:
    """Intervals of this epoch during which the map at `position` was not known to be whole.

    A degraded interval runs from its first missing seq until the clear that ends it (`to_seq`,
    or the end of its epoch). Batches the store dropped (`incomplete`, bounded by batch times)
    spoil every instant from the first of them until the next checkpoint after them.
    """
    t, c = schema.intervals, schema.checkpoints
    rows = conn.execute(
        select(t.c.kind, t.c.from_seq, t.c.to_seq, t.c.from_ts, t.c.detail).where(
            t.c.stream_id == position.stream_id,
            t.c.epoch == position.epoch,
            t.c.kind.in_(("degraded", "incomplete")),
        )
    ).all()
    instant = position.at if position.at is not None else position.ts
    reasons = []
    for row in rows:
        if row.kind == "degraded":
            covers = row.from_seq <= position.seq and (
                row.to_seq is None or position.seq < row.to_seq
            )
        else:
            checkpoint_after = conn.execute(
                select(c.c.seq).where(
                    c.c.stream_id == position.stream_id,
                    c.c.epoch == position.epoch,
                    c.c.seq > row.to_seq,
                    c.c.ts <= instant,
                )
            ).first()
            covers = instant >= row.from_ts and checkpoint_after is None
        if covers:
            reasons.append(f"{row.kind} from seq {row.from_seq}: {row.detail}")
    return reasons
