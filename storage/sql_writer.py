"""The writer thread's side: rows into SQL, a transaction at a time (SQLite or PostgreSQL)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import lru_cache
from itertools import chain
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from kvscope.collector.snapshot import compress
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.rows import (
    CheckpointRow,
    EpochRow,
    IntervalRow,
    LogRow,
    RecoveryRow,
    ResetRow,
    RollupRow,
    Row,
)

LOG_COLUMNS = ("stream_id", "epoch", "seq", "ts", "recv_ts", "payload")
LOG_ROWS_PER_STATEMENT = 5000
"""Batch-log rows per INSERT (at most; SQLite's limit on parameters may allow fewer). The
drivers let go of the GIL for each statement they execute, and taking it back while the ingest
thread runs waits out its switch interval: with one row per statement (executemany) the writer
starved until ingest paused."""


@lru_cache(maxsize=16)
def _log_insert(paramstyle: str, rows: int) -> str:
    mark = "?" if paramstyle == "qmark" else "%s"  # sqlite3; psycopg
    row = f"({', '.join([mark] * len(LOG_COLUMNS))})"
    return (
        f"INSERT INTO {schema.batches.name} ({', '.join(LOG_COLUMNS)}) "
        f"VALUES {', '.join([row] * rows)}"
    )


def _insert_log(conn: Connection, rows: list[LogRow], stream_id: Callable[[StreamId], int]) -> None:
    """The log's rows as the tuples the ingest thread made, their stream put as its id, straight
    to the driver (SQLAlchemy's per-row parameter handling would hold the GIL too): PostgreSQL
    takes them by COPY, in this transaction; SQLite as multi-row INSERTs (benchmarks/store.py:
    1000-row INSERTs ran PostgreSQL at 0.15x the baseline, COPY 0.25x)."""
    width = len(LOG_COLUMNS)
    params: list[Any] = list(chain.from_iterable(rows))
    streams = params[::width]
    if streams.count(streams[0]) == len(streams):  # one stream: the usual transaction
        params[::width] = [stream_id(streams[0])] * len(streams)
    else:
        params[::width] = [stream_id(s) for s in streams]  # before COPY: ids may need a query
    if conn.dialect.name == "postgresql":
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        copy_sql = f"COPY {schema.batches.name} ({', '.join(LOG_COLUMNS)}) FROM STDIN"
        with cursor.copy(copy_sql) as copy:
            for start in range(0, len(params), width):
                copy.write_row(params[start : start + width])
        return
    per_statement = min(LOG_ROWS_PER_STATEMENT, _max_parameters(conn) // width)
    step = per_statement * width
    for start in range(0, len(params), step):
        chunk = tuple(params[start : start + step])
        conn.exec_driver_sql(_log_insert(conn.dialect.paramstyle, len(chunk) // width), chunk)


def _max_parameters(conn: Connection) -> int:
    """SQLite's limit on a statement's parameters: 32766 since 3.32, 999 before."""
    dbapi = conn.connection.dbapi_connection
    getlimit = getattr(dbapi, "getlimit", None)  # sqlite3 on Python >= 3.11
    return 999 if getlimit is None else int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))


class RowWriter:
    """Writes rows within a caller's transaction; caches stream and reset ids between them."""

    def __init__(
        self, shard: str | None, checkpoint_written: Callable[[CheckpointRow, int], None]
    ) -> None:
        self.shard = shard
        self.checkpoint_written = checkpoint_written
        """Told each checkpoint's size on disk (the ingest side paces checkpoints by it)."""
        self._stream_ids: dict[StreamId, int] = {}
        self._reset_ids: dict[tuple[StreamId, tuple[int, int, str]], int] = {}

    def forget_ids(self) -> None:
        """A failed transaction may have rolled back ids we cached within it."""
        self._stream_ids.clear()
        self._reset_ids.clear()

    def _stream_id(self, conn: Connection, stream: StreamId) -> int:
        sid = self._stream_ids.get(stream)
        if sid is None:
            t = schema.streams
            found = conn.execute(
                select(t.c.id).where(t.c.replica == stream.replica, t.c.rank == stream.rank)
            ).scalar_one_or_none()
            if found is None:
                found = conn.execute(
                    insert(t)
                    .values(replica=stream.replica, rank=stream.rank, shard=self.shard)
                    .returning(t.c.id)
                ).scalar_one()
            sid = self._stream_ids[stream] = int(found)
        return sid

    def write(self, conn: Connection, rows: list[Row]) -> None:
        groups: dict[type, list[dict[str, Any]]] = {}
        log: list[LogRow] = []
        ordered: list[Row] = []
        for row in rows:
            if type(row) is tuple:
                log.append(row)
            elif type(row) is RollupRow:
                groups.setdefault(RollupRow, []).append(
                    {
                        "stream_id": self._stream_id(conn, row.stream),
                        "second": row.second,
                        "medium": row.medium,
                        "grp": row.group,
                        "stored": row.stored,
                        "hittable": row.hittable,
                        "orphans": row.orphans,
                        "stores": row.stores,
                        "removes": row.removes,
                        "clears": row.clears,
                        "gaps": row.gaps,
                    }
                )
            else:
                ordered.append(row)
        # Epochs, resets and recoveries keep their order (a recovery needs its reset's id).
        for row in ordered:
            self._write_one(conn, row)
        if log:
            _insert_log(conn, log, lambda stream: self._stream_id(conn, stream))
        if RollupRow in groups:
            self._upsert_rollups(conn, groups[RollupRow])

    def _upsert_rollups(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """One statement for them all. A second can come twice (its batches straddle a
        restart, or a resumed collector goes over it again): the last one wins."""
        t = schema.rollups
        dialect = conn.dialect.name
        upsert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(t)
        keys = ("stream_id", "second", "medium", "grp")
        statement = upsert.on_conflict_do_update(
            index_elements=[t.c[k] for k in keys],
            set_={c.name: upsert.excluded[c.name] for c in t.columns if c.name not in keys},
        )
        latest = {tuple(row[k] for k in keys): row for row in rows}  # one row per key
        conn.execute(statement, list(latest.values()))

    def _write_one(self, conn: Connection, row: Row) -> None:
        if type(row) is EpochRow:
            t = schema.epochs
            sid = self._stream_id(conn, row.stream)
            exists = conn.execute(
                select(t.c.epoch).where(t.c.stream_id == sid, t.c.epoch == row.epoch)
            ).first()
            if exists is None:
                conn.execute(
                    insert(t).values(stream_id=sid, epoch=row.epoch, started_recv_ts=row.recv_ts)
                )
        elif type(row) is CheckpointRow:
            conn.execute(
                insert(schema.checkpoints).values(
                    stream_id=self._stream_id(conn, row.stream),
                    epoch=row.epoch,
                    seq=row.seq,
                    ts=row.ts,
                    blocks=row.blocks,
                    snapshot=self._compressed_checkpoint(row),
                )
            )
        elif type(row) is ResetRow:
            epoch, seq, reason = row.key
            reset_id = conn.execute(
                insert(schema.resets)
                .values(
                    stream_id=self._stream_id(conn, row.stream),
                    epoch=epoch,
                    seq=seq,
                    ts=row.ts,
                    recv_ts=row.recv_ts,
                    reason=reason,
                    degraded=row.degraded,
                    before_blocks=row.before_blocks,
                    before_hittable=row.before_hittable,
                    before_orphans=row.before_orphans,
                    before_tokens=row.before_tokens,
                    before=compress(row.before),
                )
                .returning(schema.resets.c.id)
            ).scalar_one()
            self._reset_ids[(row.stream, row.key)] = int(reset_id)
        elif type(row) is RecoveryRow:
            reset_id = self._reset_id(conn, row.stream, row.key)
            t = schema.resets
            conn.execute(
                update(t)
                .where(t.c.id == reset_id)
                .values(
                    t50_s=row.t50_s,
                    t90_s=row.t90_s,
                    peak_orphans=row.peak_orphans,
                    recovery_until_ts=row.until_ts,
                )
            )
            if row.points:
                conn.execute(
                    insert(schema.reset_recovery),
                    [
                        {
                            "reset_id": reset_id,
                            "offset_s": p.offset_s,
                            "blocks": p.blocks,
                            "hittable": p.hittable,
                            "orphans": p.orphans,
                            "share_blocks_back": p.share_blocks_back,
                            "share_tokens_back": p.share_tokens_back,
                        }
                        for p in row.points
                    ],
                )
        elif type(row) is IntervalRow:
            t = schema.intervals
            sid = self._stream_id(conn, row.stream)
            values = {
                "stream_id": sid,
                "kind": row.kind,
                "epoch": row.epoch,
                "from_ts": row.from_ts,
                "to_ts": row.to_ts,
                "from_seq": row.from_seq,
                "to_seq": row.to_seq,
                "detail": row.detail,
            }
            # An interval is written when it opens and again when it closes.
            same = (
                (t.c.stream_id == sid)
                & (t.c.kind == row.kind)
                & (t.c.from_ts == row.from_ts)
                & (t.c.from_seq == row.from_seq)
            )
            if conn.execute(update(t).where(same).values(**values)).rowcount == 0:
                conn.execute(insert(t).values(**values))

    def _compressed_checkpoint(self, row: CheckpointRow) -> bytes:
        packed = compress(row.snapshot)
        self.checkpoint_written(row, len(packed))
        return packed

    def _reset_id(self, conn: Connection, stream: StreamId, key: tuple[int, int, str]) -> int:
        cached = self._reset_ids.get((stream, key))
        if cached is not None:
            return cached
        t = schema.resets
        epoch, seq, reason = key
        found = conn.execute(
            select(t.c.id).where(
                t.c.stream_id == self._stream_id(conn, stream),
                t.c.epoch == epoch,
                t.c.seq == seq,
                t.c.reason == reason,
            )
        ).scalar_one()
        return int(found)
