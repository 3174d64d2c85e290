"""Retention by age: the raw log, checkpoints, rollups and lease grants each have their own;
resets stay.

Pruning never removes what the retained window needs: every instant at or after the log's
cutoff must still rebuild, so for each epoch the newest checkpoint at or before the cutoff is
kept with the whole log after it, and the log before it goes. An epoch without such a checkpoint
keeps its log until one exists (the writer checkpoints at least every 20,000 batches). A delta
checkpoint kept keeps its key, and a checkpoint a kept log chunk names (format 6 reads its hash
literals through it; `log_chunks.known_seq`) is kept too, whatever its age.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    delete,
    exists,
    func,
    or_,
    select,
)

from kvscope.storage import batch_log, schema
from kvscope.storage.log_dictionaries_sql import prune_dictionaries

logger = logging.getLogger(__name__)
DAY = 86_400.0


@dataclass(frozen=True)
class Retention:
    log_s: float | None = 7 * DAY
    """How far back any instant can be rebuilt (the raw batch log)."""
    checkpoints_s: float | None = 7 * DAY
    rollups_s: float | None = 30 * DAY
    resets_s: float | None = None
    """Resets (with their before and recovery) are kept forever unless this is set."""
    lease_grants_s: float | None = 7 * DAY
    """Grants of streams' leases (who wrote each stream when) released or superseded this
    long ago; a lease held now keeps its grant, and the tokens (`stream_leases`) stay."""


@dataclass
class Pruned:
    batches: int = 0
    checkpoints: int = 0
    rollups: int = 0
    resets: int = 0
    engine_samples: int = 0
    lease_grants: int = 0
    dictionaries: int = 0
    """Log dictionaries no kept chunk names any more."""


def prune(engine: Engine, retention: Retention, now: float) -> Pruned:
    """Delete what is older than the retention allows (each stream and epoch on its own)."""
    pruned = Pruned()
    with engine.begin() as conn:
        if retention.log_s is not None:
            _prune_log(conn, now - retention.log_s, retention, now, pruned)
            pruned.dictionaries = prune_dictionaries(conn)
        if retention.rollups_s is not None:
            r = schema.rollups
            pruned.rollups = _deleted(conn, delete(r).where(r.c.second < now - retention.rollups_s))
            samples = schema.metadata.tables.get("engine_samples")
            if samples is not None:
                pruned.engine_samples = _deleted(
                    conn, delete(samples).where(samples.c.ts < now - retention.rollups_s)
                )
        if retention.resets_s is not None:
            old = select(schema.resets.c.id).where(schema.resets.c.ts < now - retention.resets_s)
            for table, column in _naming_resets():
                conn.execute(delete(table).where(column.in_(old)))
            pruned.resets = _deleted(
                conn, delete(schema.resets).where(schema.resets.c.ts < now - retention.resets_s)
            )
        if retention.lease_grants_s is not None:
            pruned.lease_grants = _prune_grants(conn, now - retention.lease_grants_s)
    return pruned


def _prune_grants(conn: Connection, cutoff: float) -> int:
    """Grants whose last sign (released, else last written, else granted) is older than
    `cutoff`, but for the grant a lease is held under now (its writes are still counted).
    Fencing needs none of them: the token to beat is `stream_leases.token`, never pruned."""
    g, held = schema.lease_grants, schema.stream_leases
    last = func.coalesce(g.c.released_at, g.c.last_write_at, g.c.granted_at)
    current = exists().where(
        held.c.replica == g.c.replica,
        held.c.rank == g.c.rank,
        held.c.token == g.c.token,
        held.c.owner.is_not(None),
    )
    at = datetime.fromtimestamp(cutoff, UTC)
    return _deleted(conn, delete(g).where(last < at, ~current))


def _naming_resets() -> list[tuple[Table, Column[Any]]]:
    """Every table and column that names a reset (its recovery, its prefix groups, ...): they go
    before the reset, which the database would otherwise refuse to delete."""
    return [
        (table, key.parent)
        for table in schema.metadata.sorted_tables
        for key in table.foreign_keys
        if key.column is schema.resets.c.id
    ]


def _prune_log(
    conn: Connection, cutoff: float, retention: Retention, now: float, pruned: Pruned
) -> None:
    b, c = schema.log_chunks, schema.checkpoints
    for stream_id in conn.execute(select(schema.streams.c.id)).scalars().all():
        for epoch in batch_log.epochs(conn, stream_id):
            in_epoch = and_(b.c.stream_id == stream_id, b.c.epoch == epoch)
            anchor = conn.execute(
                select(c.c.seq, c.c.ts)
                .where(c.c.stream_id == stream_id, c.c.epoch == epoch, c.c.ts <= cutoff)
                .order_by(c.c.seq.desc())
                .limit(1)
            ).first()
            if anchor is None:
                continue  # nothing to rebuild the cutoff instant from: keep this epoch's log
            # The anchor checkpoint holds the map after its seq: the log up to it is not needed
            # (a chunk that reaches past it stays whole). The bound on first_seq, implied, lets
            # the key's index find them: else every chunk of the epoch is read.
            up_to_anchor = and_(b.c.first_seq <= anchor.seq, b.c.last_seq <= anchor.seq)
            pruned.batches += _deleted_batches(conn, and_(in_epoch, up_to_anchor))
            checkpoint_cutoff = min(
                anchor.ts, now - retention.checkpoints_s if retention.checkpoints_s else anchor.ts
            )
            pruned.checkpoints += _deleted(
                conn,
                delete(c).where(
                    c.c.stream_id == stream_id,
                    c.c.epoch == epoch,
                    c.c.seq < anchor.seq,
                    c.c.ts < checkpoint_cutoff,
                    ~_a_key_kept(c, stream_id, epoch, anchor.seq, checkpoint_cutoff),
                    ~_named_by_a_chunk(c, stream_id, epoch),
                ),
            )
            newer_epoch = conn.execute(
                select(func.count())
                .select_from(b)
                .where(b.c.stream_id == stream_id, b.c.epoch > epoch, b.c.min_ts <= cutoff)
            ).scalar()
            if newer_epoch:
                # A later epoch began before the cutoff: this one lies wholly outside the window.
                pruned.batches += _deleted_batches(conn, in_epoch)
                pruned.checkpoints += _deleted(
                    conn,
                    delete(c).where(
                        c.c.stream_id == stream_id,
                        c.c.epoch == epoch,
                        ~_named_by_a_chunk(c, stream_id, epoch),
                    ),
                )


def _named_by_a_chunk(c: Table, stream_id: int, epoch: int) -> ColumnElement[bool]:
    """The checkpoint is one a stored chunk names (format 6 decodes its hash literals through
    it), or the key of a delta one names: the chunks this prune deletes are gone already. The
    keys are a subquery apart from the row, found once per statement: joined to the row, it
    walked every chunk of the epoch for each checkpoint deleted."""
    b, named = schema.log_chunks, c.alias("named")
    of_epoch = (b.c.stream_id == stream_id, b.c.epoch == epoch)
    keys_of_named = select(named.c.key_seq).where(
        named.c.stream_id == stream_id,
        named.c.epoch == epoch,
        named.c.key_seq.is_not(None),
        exists().where(*of_epoch, b.c.known_seq == named.c.seq),
    )
    return or_(exists().where(*of_epoch, b.c.known_seq == c.c.seq), c.c.seq.in_(keys_of_named))


def _a_key_kept(
    c: Table, stream_id: int, epoch: int, anchor_seq: int, cutoff: float
) -> ColumnElement[bool]:
    """The checkpoint is the key of a delta (storage/checkpoint_deltas.py) that this prune
    keeps (at or after the anchor, or younger than the cutoff)."""
    delta = c.alias("delta")
    return exists().where(
        delta.c.stream_id == stream_id,
        delta.c.epoch == epoch,
        delta.c.key_seq == c.c.seq,
        delta.c.seq != c.c.seq,
        or_(delta.c.seq >= anchor_seq, delta.c.ts >= cutoff),
    )


def _deleted_batches(conn: Connection, where: ColumnElement[bool]) -> int:
    """Delete the log chunks `where` selects; the batches they held."""
    b = schema.log_chunks
    held = conn.execute(select(func.coalesce(func.sum(b.c.batches), 0)).where(where)).scalar()
    conn.execute(delete(b).where(where))
    return int(held or 0)


def _deleted(conn: Connection, statement: object) -> int:
    result = conn.execute(statement)  # type: ignore[call-overload]
    return int(result.rowcount or 0)


class Pruner:
    """Applies retention every `interval_s` in a background thread."""

    def __init__(self, engine: Engine, retention: Retention, interval_s: float = 600.0) -> None:
        self.engine = engine
        self.retention = retention
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvscope-pruner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                pruned = prune(self.engine, self.retention, time.time())
                logger.info("pruned %s", pruned)
            except Exception:  # the store may be down: the writer reports that; try later
                logger.exception("pruning failed; will try again")
