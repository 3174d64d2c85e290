"""Each row's first bytes of a blob column, without the rest: how a migration finds the rows of
one format, or fills a column from what a stored header names. On SQLite the table must have
rowids (not WITHOUT ROWID) and the column hold no NULL: a blob handle reads it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa


def key_where(keys: Sequence[sa.Column[Any]], values: Sequence[Any]) -> sa.ColumnElement[bool]:
    """The row whose primary key columns `keys` hold `values`."""
    return sa.and_(*(c == v for c, v in zip(keys, values, strict=True)))


def row_heads(
    conn: sa.Connection, table: sa.Table, column: str, head_bytes: int, starting: bytes = b""
) -> Iterator[tuple[tuple[Any, ...], bytes]]:
    """(primary key, the first `head_bytes` of `column`) of each row whose `column` starts with
    `starting`, in key order. The rows are listed before the first is yielded: the caller may
    update each as it comes."""
    keys = list(table.primary_key.columns)
    if conn.dialect.name == "sqlite":
        yield from _sqlite_heads(conn, table, column, head_bytes, starting)
        return
    data = table.c[column]
    condition = sa.func.substr(data, 1, len(starting)) == starting if starting else sa.true()
    for key in conn.execute(sa.select(*keys).where(condition).order_by(*keys)).all():
        if not head_bytes:
            yield tuple(key), b""
            continue
        # PostgreSQL fetches no more of a value stored out of line than the slice.
        head = conn.execute(
            sa.select(sa.func.substr(data, 1, head_bytes)).where(key_where(keys, key))
        ).scalar_one()
        yield tuple(key), bytes(head or b"")


def _sqlite_heads(
    conn: sa.Connection, table: sa.Table, column: str, head_bytes: int, starting: bytes
) -> Iterator[tuple[tuple[Any, ...], bytes]]:
    """SQLite's substr reads a blob whole (every overflow page), even to compare its first
    bytes: a blob handle reads the pages the head is on."""
    keys = list(table.primary_key.columns)
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    rows = conn.execute(sa.select(sa.literal_column("rowid"), *keys).order_by(*keys)).all()
    for rowid, *key in rows:
        with driver.blobopen(table.name, column, rowid, readonly=True) as blob:
            head = blob.read(max(head_bytes, len(starting)))
        if head.startswith(starting):
            yield tuple(key), head[:head_bytes]


def keys_starting(
    conn: sa.Connection, table: sa.Table, column: str, starting: bytes
) -> list[tuple[Any, ...]]:
    """The primary keys of the rows whose `column` starts with `starting`, in key order."""
    return [key for key, _ in row_heads(conn, table, column, 0, starting)]


def fill_from_heads(
    conn: sa.Connection,
    table_name: str,
    column: str,
    head_bytes: int,
    target: str,
    value_of: Callable[[bytes], object | None],
    starting: bytes = b"",
) -> None:
    """`target` of each row whose `column` starts with `starting` set to what `value_of` reads
    in its first `head_bytes` (None: left as it is)."""
    table = sa.Table(table_name, sa.MetaData(), autoload_with=conn)
    keys = list(table.primary_key.columns)
    for key, head in row_heads(conn, table, column, head_bytes, starting):
        value = value_of(head)
        if value is not None:
            conn.execute(sa.update(table).where(key_where(keys, key)).values({target: value}))
