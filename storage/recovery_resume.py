"""After a crash: the recovery window still open in the store, rebuilt to go on following it.

The stream's latest clear is taken from the store with its `before` map; its tracker is fed the
stored batches from just after the clear to the resume point, exactly as the writer fed it live
(the map before each batch, then after it). It then stands where an uninterrupted run's tracker
stood at that batch, whatever of its rows the crash kept: points, t50/t90 and peak orphans come
from the log, not from what was written. Offsets passed by batches after the resume point (those
replayed from the publisher, then live ones) are measured as those batches apply.

Only an `all_blocks_cleared` in the resumed epoch is followed on: a restart's window (a new
epoch from an empty map) is left as stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, select

from kvscope.collector.sink import ClearReason, ResumePoint
from kvscope.collector.snapshot import decode_tables
from kvscope.collector.wire import BatchDecoder
from kvscope.storage import batch_log, schema
from kvscope.storage.history import NotInStore, Position, rebuild, stream_id
from kvscope.storage.recovery import RecoveryTracker
from kvscope.storage.recovery_follow import ResetKey

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenRecovery:
    key: ResetKey
    tracker: RecoveryTracker
    """As of the resume point's batch."""
    stored_behind: bool
    """The store's rows say less than the tracker (the crash lost some): write it again."""


def open_recovery(
    engine: Engine, point: ResumePoint, offsets: tuple[float, ...]
) -> OpenRecovery | None:
    """The stream's recovery that was still being followed at `point`, if any."""
    r = schema.resets
    with engine.connect() as conn:
        try:
            sid = stream_id(conn, point.stream.replica, point.stream.rank)
        except NotInStore:
            return None
        row = conn.execute(
            select(r).where(r.c.stream_id == sid).order_by(r.c.id.desc()).limit(1)
        ).first()
        if (
            row is None
            or row.recovery_complete
            or row.reason != ClearReason.ALL_BLOCKS_CLEARED.value
            or row.epoch != point.epoch
            or row.seq > point.last_seq
        ):
            return None
        try:
            tracker = _replayed(conn, sid, row, point, offsets)
        except NotInStore as exc:
            logger.warning(
                "%s: recovery of reset %d not followed on: %s", point.stream, row.id, exc
            )
            return None
        behind = _stored_behind(conn, row, tracker)
    logger.info(
        "%s: following the recovery of reset %d on (+%s s reached)",
        point.stream,
        row.id,
        f"{tracker.points[-1].offset_s:g}" if tracker.points else "0",
    )
    return OpenRecovery((row.epoch, row.seq, row.reason), tracker, behind)


def _replayed(
    conn: Connection, sid: int, row: Row[Any], point: ResumePoint, offsets: tuple[float, ...]
) -> RecoveryTracker:
    reset_ts, epoch, seq = row.ts, row.epoch, row.seq
    tables, _ = decode_tables(row.before)
    tracker = RecoveryTracker.start(reset_ts, tables, offsets)
    # The map just after the batch that carried the clear: the writer's first look at it.
    view = rebuild(conn, Position(sid, epoch, seq, reset_ts), point.stream).map
    decoder = BatchDecoder()
    for batch in batch_log.batches_between(conn, sid, epoch, seq, point.last_seq):
        tracker.before_batch(view, batch.ts)
        view.apply(decoder.decode(batch.payload, batch.seq), epoch)
        tracker.after_batch(view, batch.ts)
        if tracker.done:
            break
    return tracker


def _stored_behind(conn: Connection, row: Row[Any], tracker: RecoveryTracker) -> bool:
    rr = schema.reset_recovery
    stored = conn.execute(
        select(
            rr.c.offset_s,
            rr.c.blocks,
            rr.c.hittable,
            rr.c.orphans,
            rr.c.share_blocks_back,
            rr.c.share_tokens_back,
        )
        .where(rr.c.reset_id == row.id)
        .order_by(rr.c.offset_s)
    ).all()
    mine = [
        (p.offset_s, p.blocks, p.hittable, p.orphans, p.share_blocks_back, p.share_tokens_back)
        for p in tracker.points
    ]
    said = (row.t50_s, row.t90_s, bool(row.recovery_complete))
    known = (tracker.t50_s, tracker.t90_s, tracker.done)
    return [tuple(p) for p in stored] != mine or said != known
