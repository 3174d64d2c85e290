"""The writer's many-row statements, straight to the driver: log chunks, checkpoints, rollups,
a reset's recovery points and prefix groups.

Rows go as plain tuples in multi-row VALUES: SQLAlchemy's per-row parameter handling,
and its compiling of a multi-row insert, would hold the GIL for as long as the writing itself.
The drivers let go of the GIL for each statement they execute, and taking it back while the
ingest thread runs waits out its switch interval: one row per statement (executemany, which
sqlite3 steps row by row) starved the writer until ingest paused.

PostgreSQL gets one array per column instead (`INSERT ... SELECT * FROM unnest(...)`): psycopg
parses a statement's placeholders in Python, and caches only statements of at most 50 of them,
so thousands of placeholders were parsed again at every transaction, most of the writer's time.
Each column goes as one array in PostgreSQL's binary form, made in C (storage/pg_arrays.py):
psycopg dumps a list element by element in Python (and scans it for its type first), which
cost the writer more than the statement's round trip, and a column of numbers sent as text
costs a `str` of each.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from functools import lru_cache
from itertools import chain
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    Integer,
    LargeBinary,
    String,
    Table,
    update,
)

from kvscope.collector.snapshot import blocks_named
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.leases import HELD, LeaseCheck
from kvscope.storage.log_chunks import ChunkRow
from kvscope.storage.pg_arrays import BYTEA, FLOAT8, INT4, INT8, TEXT, BinaryArray, columns
from kvscope.storage.recovery import RecoveryPoint
from kvscope.storage.row_heads import key_where
from kvscope.storage.rows import CheckpointRow, RollupRow

ROLLUP_COLUMNS = tuple(c.name for c in schema.rollups.columns)
CHECKPOINT_COLUMNS = tuple(c.name for c in schema.checkpoints.columns)
ROLLUP_KEY = ("stream_id", "second", "medium", "grp")
CHUNK_KEY = ("stream_id", "epoch", "first_seq")
RECOVERY_KEY = ("reset_id", "offset_s")
CHECKPOINT_KEY = ("stream_id", "epoch", "seq")


@lru_cache(maxsize=32)
def _insert_sql(
    table: str, columns: tuple[str, ...], key: tuple[str, ...], paramstyle: str, rows: int
) -> str:
    """INSERT of `rows` rows; with a `key`, a row already there under it is overwritten (the
    same syntax in SQLite and PostgreSQL)."""
    mark = "?" if paramstyle == "qmark" else "%s"  # sqlite3; psycopg
    row = f"({', '.join([mark] * len(columns))})"
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([row] * rows)}"
    if key:
        updated = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        sql += f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updated}"
    return sql


@lru_cache(maxsize=16)
def _unnest_sql(
    table: Table, key: tuple[str, ...], dialect: Any, admitted_only: bool = False
) -> str:
    """PostgreSQL's INSERT of any number of rows, one array parameter per column (`_arrays`);
    `admitted_only`: only the rows whose stream (`stream_id`) is in a WITH clause `admitted`."""
    columns = ", ".join(c.name for c in table.columns)
    arrays = ", ".join(f"%b::{c.type.compile(dialect=dialect)}[]" for c in table.columns)
    sql = f"INSERT INTO {table.name} ({columns}) SELECT * FROM unnest({arrays})"
    if admitted_only:
        sql += f" AS given ({columns}) WHERE stream_id IN (SELECT id FROM admitted)"
    if key:
        updated = ", ".join(
            f"{c.name} = excluded.{c.name}" for c in table.columns if c.name not in key
        )
        sql += f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updated}"
    return sql


@lru_cache(maxsize=8)
def _kinds(table: Table) -> bytes:
    """The kind of array (storage/pg_arrays.py) each of `table`'s columns goes as."""
    kinds = bytearray()
    for c in table.columns:
        if isinstance(c.type, BigInteger):
            kinds.append(INT8)
        elif isinstance(c.type, Integer):
            kinds.append(INT4)
        elif isinstance(c.type, Float):
            kinds.append(FLOAT8)
        elif isinstance(c.type, LargeBinary):
            kinds.append(BYTEA)
        elif isinstance(c.type, String):
            kinds.append(TEXT)
        else:
            raise TypeError(f"{table.name}.{c.name}: no binary array for {c.type!r}")
    return bytes(kinds)


def _arrays(
    table: Table,
    rows: Sequence[Any],
    ids: dict[Any, int] | None = None,
    stream_id: Callable[[StreamId], int] | None = None,
) -> tuple[BinaryArray, ...]:
    """`rows` (tuples of all `table`'s columns) as `_unnest_sql`'s parameters; with `ids`, each
    row's first value (its stream) put as its id, made by `stream_id` where `ids` lacks it."""
    return columns(rows, _kinds(table), ids, stream_id)


def _rows_per_statement(conn: Connection, width: int) -> int:
    """Rows of `width` parameters one SQLite statement may carry: 32766 parameters since 3.32
    (999 before)."""
    getlimit = getattr(conn.connection.dbapi_connection, "getlimit", None)  # Python >= 3.11
    limit = 999 if getlimit is None else getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return max(1, int(limit) // width)


def _flat_with_ids(rows: list[Any], width: int, stream_id: Callable[[StreamId], int]) -> list[Any]:
    """The rows' values in one list, each row's first value (its stream) put as the id."""
    params: list[Any] = list(chain.from_iterable(rows))
    streams = params[::width]
    if streams.count(streams[0]) == len(streams):  # one stream: the usual transaction
        params[::width] = [stream_id(streams[0])] * len(streams)
    else:
        params[::width] = [stream_id(s) for s in streams]
    return params


def _execute(
    conn: Connection,
    table: Table,
    key: tuple[str, ...],
    rows: Sequence[Any],
    stream_id: Callable[[StreamId], int] | None,
    most: int,
) -> None:
    """`rows` (tuples of all `table`'s columns; with `stream_id`, each starting with its stream,
    put as its id) in one statement on PostgreSQL, in as many as it takes of at most `most` rows
    on SQLite."""
    columns = tuple(c.name for c in table.columns)
    width = len(columns)
    if conn.dialect.name == "postgresql":
        ids: dict[Any, int] | None = None if stream_id is None else {}
        arrays = _arrays(table, rows, ids, stream_id)
        conn.exec_driver_sql(_unnest_sql(table, key, conn.dialect), arrays)
        return
    if stream_id is None:
        params: list[Any] = list(chain.from_iterable(rows))
    else:
        params = _flat_with_ids(list(rows), width, stream_id)
    step = min(most, _rows_per_statement(conn, width)) * width
    for start in range(0, len(params), step):
        chunk = tuple(params[start : start + step])
        sql = _insert_sql(table.name, columns, key, conn.dialect.paramstyle, len(chunk) // width)
        conn.exec_driver_sql(sql, chunk)


LOG_TABLES = (schema.log_chunks, schema.checkpoints, schema.rollups)
"""What the log's statement writes, in this order (each table that has rows)."""
_KEYS = {"log_chunks": CHUNK_KEY, "checkpoints": CHECKPOINT_KEY, "rollups": ROLLUP_KEY}


@lru_cache(maxsize=16)
def _log_sql(dialect: Any, tables: tuple[Table, ...], fenced: bool = False) -> str:
    """PostgreSQL's one statement for a transaction's log: the rows of each of `tables` but
    the last in a data-modifying WITH clause (run to completion, read or not), the last's as
    the statement itself. `fenced`: after a lease check's clauses (storage/leases.py's
    `LeaseCheck`), every table's rows in WITH clauses, only those of the streams it admits;
    the statement answers which."""
    if fenced:
        admitted = (
            "admitted AS (SELECT streams.id FROM streams JOIN held"
            " ON streams.replica = held.replica AND streams.rank = held.rank)"
        )
        clauses = [LeaseCheck.SQL, admitted]
        clauses += [
            f"{t.name}_written AS ({_unnest_sql(t, _KEYS[t.name], dialect, True)})" for t in tables
        ]
        return f"WITH {', '.join(clauses)} {HELD}"
    *first, last = tables
    written = [f"{t.name}_written AS ({_unnest_sql(t, _KEYS[t.name], dialect)})" for t in first]
    statement = _unnest_sql(last, _KEYS[last.name], dialect)
    return f"WITH {', '.join(written)} {statement}" if written else statement


def upsert_rows(conn: Connection, table: Table, key: tuple[str, ...], rows: Sequence[Any]) -> None:
    """`rows` (tuples of all `table`'s columns, in its order) in one statement (SQLite: one per
    as many as it takes); a row already there under `key` is overwritten."""
    _execute(conn, table, key, rows, None, 1000)


def insert_chunks(
    conn: Connection, chunks: list[ChunkRow], stream_id: Callable[[StreamId], int]
) -> None:
    """One statement for the transaction's chunks (sqlite3's executemany lets go of the GIL and
    takes it back for every row). A chunk already there is overwritten with itself: the
    transaction is being retried after a commit whose answer was lost."""
    _execute(conn, schema.log_chunks, CHUNK_KEY, chunks, stream_id, 1000)


def upsert_rollups(
    conn: Connection, rows: list[RollupRow], stream_id: Callable[[StreamId], int]
) -> None:
    """A second can come twice (its batches straddle a restart, or a resumed collector goes over
    it again): the last one wins."""
    _execute(conn, schema.rollups, ROLLUP_KEY, _rollup_values(rows), stream_id, 5000)


def _rollup_values(rows: list[RollupRow]) -> list[tuple[Any, ...]]:
    """Each row's columns, its stream first; the last of each key's rows alone (one statement
    may not set a row twice)."""
    latest = {(r.stream, r.second, r.medium, r.group): r for r in rows}
    return [
        (r.stream, r.second, r.medium, r.group, r.stored, r.hittable, r.orphans)
        + (r.stores, r.removes, r.clears, r.gaps)
        for r in latest.values()
    ]


@lru_cache(maxsize=2)
def _repacked_sql(dialect: Any) -> str:
    """PostgreSQL's UPDATE of any number of chunks' re-packed columns, keyed by the chunk's key
    (`REPACKED_ROW`: one array parameter per column)."""
    c = schema.log_chunks.c
    arrays = ", ".join(f"%b::{c[n].type.compile(dialect=dialect)}[]" for n in REPACKED_ROW)
    changed = ", ".join(f"{n} = given.{n}" for n in REPACKED_ROW if n not in CHUNK_KEY)
    matched = " AND ".join(f"log_chunks.{n} = given.{n}" for n in CHUNK_KEY)
    return (
        f"UPDATE log_chunks SET {changed} FROM unnest({arrays})"
        f" AS given ({', '.join(REPACKED_ROW)}) WHERE {matched}"
    )


REPACKED_COLUMNS = ("data", "raw_bytes", "dictionary", "known_seq")
"""What re-packing a chunk changes (storage/log_rewrite.py's `repacked`)."""
REPACKED_ROW = (*CHUNK_KEY, *REPACKED_COLUMNS)
"""A re-packed chunk as `update_repacked` takes it: its key, then what re-packing changed."""


def update_repacked(conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Chunks re-packed in place (`REPACKED_ROW` each; storage/log_rewrite.py's `repacked`):
    one statement on PostgreSQL, a round trip instead of one a chunk; one UPDATE a chunk on
    SQLite (no round trip to save). Each chunk's row changes whole: a reader sees its old bytes
    or its new ones."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        kinds = _kinds(schema.log_chunks)
        names = [c.name for c in schema.log_chunks.columns]
        row_kinds = bytes(kinds[names.index(n)] for n in REPACKED_ROW)
        conn.exec_driver_sql(_repacked_sql(conn.dialect), columns(list(rows), row_kinds))
        return
    c = schema.log_chunks
    keys = list(c.primary_key.columns)
    width = len(CHUNK_KEY)
    for row in rows:
        values = dict(zip(REPACKED_COLUMNS, row[width:], strict=True))
        conn.execute(update(c).where(key_where(keys, row[:width])).values(values))


def insert_log(
    conn: Connection,
    chunks: list[ChunkRow],
    rollups: list[RollupRow],
    stream_id: Callable[[StreamId], int],
    ids: dict[Any, int] | None = None,
    checkpoints: Sequence[CheckpointRow] = (),
) -> None:
    """A transaction's chunks (`insert_chunks`), rollups (`upsert_rollups`) and checkpoints
    (encoded: `CheckpointRow.packed`; one already there under its key is overwritten): on
    PostgreSQL all in one statement, a round trip (and the GIL let go and taken back several
    times) fewer for each table past the first, each stream's id read from `ids` (the writer's
    cache, which gets those `stream_id` makes) before `stream_id` is asked."""
    if conn.dialect.name != "postgresql":
        for row in checkpoints:
            values = dict(zip(CHECKPOINT_COLUMNS, _checkpoint_values(row), strict=True))
            values["stream_id"] = stream_id(row.stream)
            # The map's copy not kept by SQLite after.
            upsert_released(conn, schema.checkpoints, CHECKPOINT_KEY, values)
        if chunks:
            insert_chunks(conn, chunks, stream_id)
        if rollups:
            upsert_rollups(conn, rollups, stream_id)
        return
    tables, params = _log_params(chunks, rollups, checkpoints, stream_id, ids)
    if tables:
        conn.exec_driver_sql(_log_sql(conn.dialect, tables), params)


def insert_log_fenced(
    conn: Connection,
    check: LeaseCheck,
    chunks: list[ChunkRow],
    rollups: list[RollupRow],
    checkpoints: Sequence[CheckpointRow],
    ids: dict[Any, int],
) -> set[StreamId]:
    """PostgreSQL: `insert_log` and the lease check of its rows' streams (`check`) in one
    statement, their ids all in `ids`: the rows of the streams it admits written, the rest
    left out; which it admits."""
    tables, params = _log_params(chunks, rollups, checkpoints, ids.__getitem__, ids)
    sql = _log_sql(conn.dialect, tables, fenced=True)
    return check.admitted(conn.exec_driver_sql(sql, check.params + params))


def _log_params(
    chunks: list[ChunkRow],
    rollups: list[RollupRow],
    checkpoints: Sequence[CheckpointRow],
    stream_id: Callable[[StreamId], int],
    ids: dict[Any, int] | None,
) -> tuple[tuple[Table, ...], tuple[BinaryArray, ...]]:
    """The log's tables that have rows (in `LOG_TABLES`' order), and their arrays."""
    rows: dict[Table, Sequence[Any]] = {
        schema.log_chunks: chunks,
        schema.checkpoints: _latest_checkpoints(checkpoints),
        schema.rollups: _rollup_values(rollups),
    }
    tables = tuple(t for t in LOG_TABLES if rows[t])
    ids = {} if ids is None else ids
    params: tuple[BinaryArray, ...] = ()
    for table in tables:
        params += _arrays(table, rows[table], ids, stream_id)
    return tables, params


def _checkpoint_values(row: CheckpointRow) -> tuple[Any, ...]:
    """The checkpoint's columns (`CHECKPOINT_COLUMNS`), its stream first."""
    packed = row.packed
    return (row.stream, row.epoch, row.seq, row.ts, row.blocks, packed, row.key_seq) + (
        blocks_named(packed),
    )


def _latest_checkpoints(rows: Sequence[CheckpointRow]) -> list[tuple[Any, ...]]:
    """Each checkpoint's columns; the last of each key's alone (one statement may not set a row
    twice)."""
    return list({(r.stream, r.epoch, r.seq): _checkpoint_values(r) for r in rows}.values())


def upsert_recovery_points(
    conn: Connection, reset_id: int, points: Sequence[RecoveryPoint]
) -> None:
    """A reset's recovery points in one statement (executemany steps, and hands the GIL back,
    per point). A point already there is overwritten: a recovery written again, fuller,
    replaces what it said before."""
    upsert_rows(conn, schema.reset_recovery, RECOVERY_KEY, _point_rows(reset_id, points))


def _point_rows(reset_id: int, points: Sequence[RecoveryPoint]) -> list[tuple[Any, ...]]:
    return [
        (reset_id, p.offset_s, p.blocks, p.hittable, p.orphans)
        + (p.share_blocks_back, p.share_tokens_back)
        for p in points
    ]


RECOVERY_FIGURES = ("t50_s", "t90_s", "peak_orphans", "recovery_until_ts", "recovery_complete")
"""The columns of `resets` a recovery row sets (`RecoveryRow`'s figures, in this order)."""


@lru_cache(maxsize=4)
def _recovery_sql(dialect: Any) -> str:
    """PostgreSQL's one statement for a recovery row: its reset's figures and its points."""
    points = _unnest_sql(schema.reset_recovery, RECOVERY_KEY, dialect)
    figures = ", ".join(f"{c} = %s" for c in RECOVERY_FIGURES)
    return f"WITH reset_recovery_written AS ({points}) UPDATE resets SET {figures} WHERE id = %s"


def update_recovery(
    conn: Connection,
    reset_id: int,
    figures: tuple[Any, ...],
    points: Sequence[RecoveryPoint],
) -> int | None:
    """On PostgreSQL, a recovery row in one statement: its reset's `figures`
    (`RECOVERY_FIGURES`) and its `points` upserted (a round trip fewer than two), and the
    resets updated (0 or 1); None (nothing done) elsewhere, or without points."""
    if conn.dialect.name != "postgresql" or not points:
        return None
    params = (*_arrays(schema.reset_recovery, _point_rows(reset_id, points)), *figures, reset_id)
    return int(conn.exec_driver_sql(_recovery_sql(conn.dialect), params).rowcount)


@lru_cache(maxsize=8)
def _released_sql(
    table: str,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    updated: tuple[str, ...],
    returning: str | None,
) -> str:
    """SQLite's upsert of one row (names quoted where they must be), made only where its last
    parameter is true."""
    marks = ", ".join(["?"] * len(columns))
    sets = ", ".join(f"{c} = excluded.{c}" for c in updated)
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {marks} WHERE ? "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}"
    )
    return sql if returning is None else f"{sql} RETURNING {returning}"


def upsert_released(
    conn: Connection,
    table: Table,
    key: tuple[str, ...],
    values: Mapping[str, Any],
    updated: tuple[str, ...] | None = None,
    returning: str | None = None,
) -> Any:
    """SQLite only: upsert one row that holds a large blob (a map, a log dictionary), its
    columns `updated` (default: all but `key`) overwritten where a row is there under `key`;
    the `returning` column's value, if asked for.

    sqlite3 caches each statement with the values last bound to it, a copy of the blob kept
    until it is bound again: the statement is run once more with its row left out (every
    value NULL, none made), which frees the copy at the cost of a step that does nothing."""
    columns = tuple(values)
    if updated is None:
        updated = tuple(c for c in columns if c not in key)
    quote = conn.dialect.identifier_preparer.quote
    sql = _released_sql(
        quote(table.name),
        tuple(map(quote, columns)),
        tuple(map(quote, key)),
        tuple(map(quote, updated)),
        None if returning is None else quote(returning),
    )
    try:
        found = conn.exec_driver_sql(sql, (*values.values(), 1))
        value = None if returning is None else found.scalar_one()
    except BaseException:
        # The failed run's blob stays bound too, while the writer waits to retry: its values
        # are replaced before the step, so they go even where the store refuses the step too.
        with suppress(Exception):
            conn.exec_driver_sql(sql, (None,) * len(columns) + (0,))
        raise
    conn.exec_driver_sql(sql, (None,) * len(columns) + (0,))
    return value
