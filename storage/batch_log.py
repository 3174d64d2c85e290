"""Finding batches in the stored log (its rows are chunks of batches: see log_chunks)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from sqlalchemy import Connection, func, select

from kvscope.storage import schema
from kvscope.storage.log_chunks import MAX_CHUNK_SPAN_S, Chunk, LoggedBatch, Stamp
from kvscope.storage.log_dictionaries_sql import open_chunk

_t = schema.log_chunks


@dataclass(frozen=True, slots=True)
class EpochBatch:
    epoch: int
    batch: LoggedBatch


@dataclass(frozen=True, slots=True)
class EpochStamp:
    epoch: int
    stamp: Stamp


def _chunk_at_or_before(conn: Connection, sid: int, epoch: int, seq: int) -> Chunk | None:
    data = conn.execute(
        select(_t.c.data)
        .where(_t.c.stream_id == sid, _t.c.epoch == epoch, _t.c.first_seq <= seq)
        .order_by(_t.c.first_seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    return None if data is None else open_chunk(conn, sid, data)


def batch_at_or_before(conn: Connection, sid: int, epoch: int, seq: int) -> LoggedBatch | None:
    """The last stored batch of `epoch` with a seq <= `seq`."""
    chunk = _chunk_at_or_before(conn, sid, epoch, seq)
    return None if chunk is None else chunk.at_or_before(seq)


def batch_at(conn: Connection, sid: int, epoch: int, seq: int) -> LoggedBatch | None:
    """Batch `seq` of `epoch`, if stored."""
    found = batch_at_or_before(conn, sid, epoch, seq)
    return found if found is not None and found.seq == seq else None


def stamp_at(conn: Connection, sid: int, epoch: int, seq: int) -> Stamp | None:
    """Batch `seq` of `epoch`'s stamps, if stored (its payload is not read)."""
    chunk = _chunk_at_or_before(conn, sid, epoch, seq)
    return None if chunk is None else chunk.stamp_of(seq)


def held_at(conn: Connection, sid: int, seq: int) -> list[EpochStamp]:
    """Batch `seq`'s stamps in each epoch whose stored log holds it, latest epoch first."""
    held = []
    for epoch in reversed(epochs(conn, sid)):
        stamp = stamp_at(conn, sid, epoch, seq)
        if stamp is not None:
            held.append(EpochStamp(epoch, stamp))
    return held


def epochs(conn: Connection, sid: int) -> list[int]:
    """The epochs in the stream's log, ascending.

    One indexed lookup per epoch: a DISTINCT, or a query on the chunks' seq bounds across
    epochs, would read every chunk's key (a week of a replica's log is ~600k chunks).
    """
    found: list[int] = []
    while True:
        query = select(func.min(_t.c.epoch)).where(_t.c.stream_id == sid)
        if found:
            query = query.where(_t.c.epoch > found[-1])
        epoch = conn.execute(query).scalar()
        if epoch is None:
            return found
        found.append(int(epoch))


def last_epoch(conn: Connection, sid: int) -> int | None:
    epoch: int | None = conn.execute(
        select(func.max(_t.c.epoch)).where(_t.c.stream_id == sid)
    ).scalar()
    return epoch


def last_batch(conn: Connection, sid: int, epoch: int) -> LoggedBatch | None:
    # Within an epoch the chunks' seqs ascend: the last chunk by its first seq holds it.
    data = conn.execute(
        select(_t.c.data)
        .where(_t.c.stream_id == sid, _t.c.epoch == epoch)
        .order_by(_t.c.first_seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    if data is None:
        return None
    chunk = open_chunk(conn, sid, data)
    return chunk.batch(len(chunk) - 1)


def batches_between(
    conn: Connection, sid: int, epoch: int, after: int, upto: int
) -> Iterator[LoggedBatch]:
    """The stored batches of `epoch` with after < seq <= upto, in order."""
    for chunk in _chunks_between(conn, sid, epoch, after, upto):
        yield from chunk.between(after, upto)


def payloads_between(
    conn: Connection, sid: int, epoch: int, after: int, upto: int
) -> Iterator[tuple[int, bytes]]:
    """(seq, payload) of the same batches: what a rebuild replays, without a record per batch
    (nor a generator's step: chained in C)."""
    return chain.from_iterable(
        chunk.payloads_between(after, upto)
        for chunk in _chunks_between(conn, sid, epoch, after, upto)
    )


def _chunks_between(
    conn: Connection, sid: int, epoch: int, after: int, upto: int
) -> Iterator[Chunk]:
    """The chunks of `epoch` that hold batches with after < seq <= upto, in order."""
    # From the chunk holding seq after + 1: the chunks' first seqs bound an indexed range.
    start = conn.execute(
        select(_t.c.first_seq)
        .where(_t.c.stream_id == sid, _t.c.epoch == epoch, _t.c.first_seq <= after + 1)
        .order_by(_t.c.first_seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    rows = conn.execute(
        select(_t.c.data)
        .where(_t.c.stream_id == sid, _t.c.epoch == epoch)
        .where(_t.c.first_seq >= (after + 1 if start is None else start))
        .where(_t.c.first_seq <= upto)
        .order_by(_t.c.first_seq)
    ).scalars()
    for data in rows:
        yield open_chunk(conn, sid, data)


def stamped_last_before(conn: Connection, sid: int, at: float) -> EpochStamp | None:
    """The batch with the greatest (ts, epoch, seq) among those stamped at or before `at`.

    Exact whatever the engine's clock did: the chunks that may hold it are those whose latest
    batch is the latest at or before `at`, and those that straddle `at`, which start within
    `MAX_CHUNK_SPAN_S` before it.
    """
    ends_before = conn.execute(
        select(func.max(_t.c.max_ts)).where(_t.c.stream_id == sid, _t.c.max_ts <= at)
    ).scalar()
    # Two queries, each along one index (an OR of the two would read every chunk).
    # A second's margin: the span is checked on floats where they were written.
    straddling = select(_t.c.epoch, _t.c.data).where(
        _t.c.stream_id == sid,
        _t.c.min_ts > at - MAX_CHUNK_SPAN_S - 1.0,
        _t.c.min_ts <= at,
        _t.c.max_ts > at,
    )
    rows = list(conn.execute(straddling).all())
    if ends_before is not None:
        ending = select(_t.c.epoch, _t.c.data).where(
            _t.c.stream_id == sid, _t.c.max_ts == ends_before
        )
        rows.extend(conn.execute(ending).all())
    best: EpochStamp | None = None
    for epoch, data in rows:
        chunk = open_chunk(conn, sid, data)
        for i, ts in enumerate(chunk.ts):
            if ts <= at and (
                best is None
                or (ts, epoch, chunk.seqs[i]) > (best.stamp.ts, best.epoch, best.stamp.seq)
            ):
                best = EpochStamp(epoch, chunk.stamp(i))
    return best


def holds_later(conn: Connection, sid: int, at: float) -> bool:
    """Whether a batch stamped after `at` is stored (then every batch up to `at` is too: the
    writer stores them in the order applied)."""
    later = conn.execute(
        select(_t.c.first_seq).where(_t.c.stream_id == sid, _t.c.max_ts > at).limit(1)
    ).first()
    return later is not None


def first_ts(conn: Connection, sid: int) -> float | None:
    ts: float | None = conn.execute(
        select(func.min(_t.c.min_ts)).where(_t.c.stream_id == sid)
    ).scalar()
    return ts


def count_batches(conn: Connection, sid: int | None = None, epoch: int | None = None) -> int:
    query = select(func.coalesce(func.sum(_t.c.batches), 0))
    if sid is not None:
        query = query.where(_t.c.stream_id == sid)
    if epoch is not None:
        query = query.where(_t.c.epoch == epoch)
    return int(conn.execute(query).scalar_one())


def all_batches(conn: Connection, sid: int) -> Iterator[EpochBatch]:
    """Every stored batch of the stream, in (epoch, seq) order."""
    rows = conn.execute(
        select(_t.c.epoch, _t.c.data)
        .where(_t.c.stream_id == sid)
        .order_by(_t.c.epoch, _t.c.first_seq)
    ).all()
    for epoch, data in rows:
        chunk = open_chunk(conn, sid, data)
        for i in range(len(chunk)):
            yield EpochBatch(epoch, chunk.batch(i))


def engine_time(conn: Connection, sid: int, recv_at: float) -> float | None:
    """The engine-clock instant of `recv_at` on the collector's clock: shifted by the two clocks'
    offset at the last batch received at or before it (or the first after, if none was), since
    the engine's clock may be skewed or, in the lab, simulated. None: no batch stored.

    Of equal receive times, the last stored wins (before) or the first (after). Only chunks that
    can hold the answer are read, by their receive-time bounds: those whose latest batch is the
    latest received by `recv_at`, those that straddle it, and any without bounds (written by
    an older kvscope); when nothing was received by then, those holding the earliest.
    """
    lo, hi = _t.c.min_recv_ts, _t.c.max_recv_ts
    mine = _t.c.stream_id == sid
    latest = conn.execute(select(func.max(hi)).where(mine, hi <= recv_at)).scalar()
    near = (hi > recv_at) & (lo <= recv_at)
    if latest is not None:
        near = near | (hi == latest)
    before, after = _nearest(conn, sid, mine & (near | hi.is_(None)), recv_at)
    if before is None:  # nothing received by then: the earliest batch of all
        earliest = conn.execute(select(func.min(lo)).where(mine)).scalar()
        if earliest is not None:
            _, after = _nearest(conn, sid, mine & ((lo == earliest) | hi.is_(None)), recv_at)
    nearest = before or after
    return None if nearest is None else recv_at + nearest[1] - nearest[0]


def _nearest(
    conn: Connection, sid: int, where: Any, recv_at: float
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(recv_ts, ts) of the latest batch received at or before `recv_at` and of the earliest
    after it, among the chunks `where` selects, read in the order stored."""
    before: tuple[float, float] | None = None
    after: tuple[float, float] | None = None
    query = select(_t.c.data).where(where).order_by(_t.c.epoch, _t.c.first_seq)
    for data in conn.execute(query).scalars():
        chunk = open_chunk(conn, sid, data)
        for pair in zip(chunk.recv_ts, chunk.ts, strict=True):
            if pair[0] <= recv_at:
                before = pair if before is None or pair[0] >= before[0] else before
            elif after is None or pair[0] < after[0]:
                after = pair
    return before, after
