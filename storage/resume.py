"""Starting a collector where the store left off (after a crash, a kill -9, a restart).

The map after the last stored batch is rebuilt (checkpoint plus log) into a `ResumePoint`, which
the entry point hands to the collector; the stream's first replay then asks the publisher for
everything after that batch and checks the batch itself, so a publisher that restarted meanwhile
is noticed too.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, select

from kvscope.collector.sink import DegradedChange, DegradedStep, ResumePoint
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.history import NotInStore, Position, rebuild, stream_id

logger = logging.getLogger(__name__)


def resume_point(engine: Engine, stream: StreamId) -> ResumePoint | None:
    """The stream's last stored state; None when the store has none."""
    i = schema.intervals
    with engine.connect() as conn:
        try:
            sid = stream_id(conn, stream.replica, stream.rank)
        except NotInStore:
            return None
        epoch = batch_log.last_epoch(conn, sid)
        last = None if epoch is None else batch_log.last_batch(conn, sid, epoch)
        if epoch is None or last is None:
            return None
        rebuilt = rebuild(conn, Position(sid, epoch, last.seq, last.ts), stream)
        open_degraded = conn.execute(
            select(i.c.from_ts, i.c.from_seq, i.c.detail)
            .where(i.c.stream_id == sid, i.c.epoch == epoch, i.c.kind == "degraded")
            .where(i.c.to_seq.is_(None), i.c.to_ts.is_(None))
            .order_by(i.c.from_ts, i.c.id)
        ).all()
    # The same intervals (same starts), so that closing them later closes the stored rows.
    degraded = tuple(
        DegradedChange(
            DegradedStep.OPENED,
            stream,
            epoch,
            reason=row.detail.split(" (seq")[0],
            from_seq=row.from_seq,
            to_seq=None,
            since=row.from_ts,
        )
        for row in open_degraded
    )
    logger.info(
        "%s: resumed from the store at epoch %d seq %d (%d blocks)",
        stream,
        epoch,
        last.seq,
        rebuilt.map.totals().blocks,
    )
    return ResumePoint(stream, rebuilt.map, epoch, last.seq, last.payload, degraded)
