"""Intervals left open by a collector that died (`kill -9`): closed when the next one resumes.

A connected stretch is written when it opens and again when it closes; a process killed in
between leaves it open for good, as if the stream were still connected. Its true end is not
known: the last batch the store holds is the latest instant it is known to have lasted to.
"""

from __future__ import annotations

from sqlalchemy import Engine, update

from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.history import NotInStore, stream_id


def close_dangling_connections(engine: Engine, stream: StreamId) -> int:
    """Close the stream's open connected intervals at its last stored batch (or where they
    began, if that is later); the number closed."""
    t = schema.intervals
    with engine.begin() as conn:
        try:
            sid = stream_id(conn, stream.replica, stream.rank)
        except NotInStore:
            return 0
        epoch = batch_log.last_epoch(conn, sid)
        last = None if epoch is None else batch_log.last_batch(conn, sid, epoch)
        open_ = (t.c.stream_id == sid) & (t.c.kind == "connected") & t.c.to_ts.is_(None)
        closed = 0
        if last is not None:
            closed += conn.execute(
                update(t).where(open_ & (t.c.from_ts <= last.recv_ts)).values(to_ts=last.recv_ts)
            ).rowcount
        closed += conn.execute(update(t).where(open_).values(to_ts=t.c.from_ts)).rowcount
        return closed
