"""What a store written before migrations 0008 and 0009 lacks, computed from what it kept: each
reset's prefix groups (`reset_prefix_groups`), tokens recomputed and orphans left (`resets`),
and each log chunk's receive-time bounds (`log_chunks`).

The writer stores them with each recovery row it writes (storage/prefix_groups_store.py); a
reset stored by an older kvscope has none, so the reset explorer's prefix and modes panels
would leave it out. Each is computed as the writer would, from its `before` map and the batch
log, one reset per transaction; a reset whose log was pruned is left as it is and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select, update

from kvscope.storage import schema
from kvscope.storage.history import NotInStore
from kvscope.storage.log_dictionaries_sql import open_chunk
from kvscope.storage.prefix_groups_store import store_prefix_groups


@dataclass(frozen=True)
class Backfilled:
    resets: int
    """Resets given their groups and figures."""
    groups: int
    log_gone: int
    """Resets left without: their batch log was pruned."""
    chunks: int = 0
    """Log chunks given their receive-time bounds."""
    answered_meanwhile: int = 0
    """Resets left as they are: a live writer gave them their figures after they were listed
    (it writes only what differs from its own last answer, so a rewrite after it would stay)."""


def missing(engine: Engine) -> list[int]:
    """Resets without stored figures, oldest first (the writer stores both together)."""
    r = schema.resets
    with engine.connect() as conn:
        query = select(r.c.id).where(r.c.tokens_recomputed.is_(None)).order_by(r.c.id)
        return [int(i) for i in conn.execute(query).scalars()]


def backfill(engine: Engine, progress: Callable[[int], None] | None = None) -> Backfilled:
    chunks = backfill_chunk_bounds(engine)
    done = groups = gone = answered = 0
    for reset_id in missing(engine):
        try:
            with engine.begin() as conn:
                if not _still_missing(conn, reset_id):
                    answered += 1
                    continue
                groups += store_prefix_groups(conn, reset_id)
        except NotInStore:
            gone += 1
            continue
        done += 1
        if progress is not None:
            progress(done)
    return Backfilled(done, groups, gone, chunks, answered)


def _still_missing(conn: Connection, reset_id: int) -> bool:
    """Whether the reset still has no figures, its row held by this transaction until it
    commits: the writer's first answer updates the row first, so one of the two waits for the
    other, and the writer's answers are never followed by a rewrite they do not know of."""
    r = schema.resets
    claim = (
        update(r)
        .where(r.c.id == reset_id, r.c.tokens_recomputed.is_(None))
        .values(tokens_recomputed=None)
    )
    return bool(conn.execute(claim).rowcount)


def backfill_chunk_bounds(engine: Engine) -> int:
    """Receive-time bounds for log chunks an older kvscope wrote (migration 0009); returns how
    many chunks were given theirs. A chunk at a time: each is read and decompressed once."""
    t = schema.log_chunks
    key = (t.c.stream_id, t.c.epoch, t.c.first_seq)
    with engine.connect() as conn:
        missing_keys = conn.execute(select(*key).where(t.c.max_recv_ts.is_(None))).all()
    for sid, epoch, first in missing_keys:
        with engine.begin() as conn:
            where = (t.c.stream_id == sid) & (t.c.epoch == epoch) & (t.c.first_seq == first)
            data = conn.execute(select(t.c.data).where(where)).scalar_one()
            recv = open_chunk(conn, sid, data).recv_ts
            conn.execute(
                update(t).where(where).values(min_recv_ts=min(recv), max_recv_ts=max(recv))
            )
    return len(missing_keys)
