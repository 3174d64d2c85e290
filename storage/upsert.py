"""The writer's upsert statements: an INSERT that overwrites the row already under its key,
built once per dialect, table, key and columns."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from sqlalchemy import Connection, Insert, Table
from sqlalchemy.dialects import postgresql, sqlite


def upsert_statement(
    conn: Connection, table: Table, key: tuple[str, ...], only: Iterable[str] | None = None
) -> Insert:
    """An INSERT that overwrites the row already under `key` (its columns in `only`, default
    all): a transaction retried after its commit landed but the answer was lost (the connection
    dropped) writes the same rows again, and must not fail on them forever; a recovery written
    again, fuller, replaces what it said before."""
    names = None if only is None else tuple(sorted(only))
    return _upsert_of(conn.dialect.name, table, key, names)


@lru_cache(maxsize=64)
def _upsert_of(
    dialect: str, table: Table, key: tuple[str, ...], only: tuple[str, ...] | None
) -> Insert:
    """`upsert_statement`'s statement, made once: building one costs more than the row's write,
    and a statement is immutable, so every transaction (and thread) can run the same one."""
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = dialect_insert(table)
    names = {c.name for c in table.columns} if only is None else set(only)
    return statement.on_conflict_do_update(
        index_elements=list(key),
        set_={
            c.name: statement.excluded[c.name]
            for c in table.columns
            if c.name in names and c.name not in key
        },
    )
