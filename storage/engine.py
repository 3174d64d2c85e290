"""Opening a store: SQLite (a file in WAL mode, the default) or PostgreSQL, migrated to head.

A store opened only to be read (`dump`, `resets`, `report`, and the API when it cannot write)
is never migrated and never changed: a SQLite file that this process may not write (a backup, a
read-only mount, another user's file) is opened read-only.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    NotSupportedError,
    ProgrammingError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from kvscope.storage.pg_arrays import register

DEFAULT_STORE = "sqlite:///kvscope.sqlite"
MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_PAGE_SIZE = 4096
"""SQLite's default. Each table and index takes a page at the least: with 16 KB pages a new
store's empty pages outweighed all that a few minutes' lab recording stores besides
(benchmarks/store.py), for a small saving of the writer's time on large streams."""
SQLITE_CACHE_KIB = 512
"""Each connection's page cache (SQLite's default is about 2 MB), held for as long as the
connection: the writer's statements touch a few pages of each table and index, and the
checkpoint and log blobs it writes and the rebuilds read pass through once; the OS keeps the
file's pages either way."""


class StoreError(RuntimeError):
    """A store that cannot be opened as asked (missing, unreadable, or at another schema)."""


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL; None for another backend or an in-memory database."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def writable(path: Path) -> bool:
    """Whether this process may change the SQLite file (and make its -wal and -shm beside it)."""
    folder = path.parent if str(path.parent) else Path(".")
    return os.access(path, os.W_OK) and os.access(folder, os.W_OK | os.X_OK)


def may_write(url: str) -> bool:
    """False for a SQLite file that exists and this process may not write; True otherwise (a
    server decides for itself)."""
    path = sqlite_path(make_url(url))
    return path is None or not path.exists() or writable(path)


def _read_only_sqlite(path: Path) -> Engine:
    """A file this process may not write, opened read-only. Without a -wal file beside it no
    writer has it open, and a read-only folder cannot take the -shm a WAL reader makes: the file
    is then read as immutable."""
    immutable = "" if path.with_name(path.name + "-wal").exists() else "&immutable=1"
    return create_engine(
        "sqlite://",
        creator=_connect_uri(f"file:{path.resolve()}?mode=ro{immutable}"),
    )


def _connect_uri(uri: str) -> Any:
    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)

    return connect


def make_engine(url: str, read_only: bool = False) -> Engine:
    """An engine for `url`; SQLite files get WAL, a busy timeout and foreign keys.

    With `read_only`, a SQLite file this process may not write is opened read-only (a missing
    one is a `StoreError`, not a new empty store)."""
    parsed = make_url(url)
    path = sqlite_path(parsed)
    if read_only and path is not None:
        if not path.exists():
            raise StoreError(f"no store at {path}")
        if not writable(path):
            return _read_only_sqlite(path)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            # Take effect only on a new, empty file (before WAL); an older file keeps its own.
            cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
            # Free pages given back while the writer idles (storage/free_pages.py). Only on an
            # empty file: setting it takes the write lock, even where it changes nothing.
            if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
                cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            cursor.close()

        return engine
    engine = create_engine(url)
    _ping_after_idle(engine)
    # Each connection as it opens: the writer's bulk statements send binary arrays.
    event.listen(engine, "connect", lambda dbapi_connection, _record: register(dbapi_connection))
    return engine


PING_AFTER_IDLE_S = 30.0
"""A pooled server connection idle longer than this is pinged as it is checked out, and
replaced if it does not answer. One used more recently is taken as alive: `pool_pre_ping`
pinged at every checkout, a round trip (and the GIL let go and taken back several times) in
every one of the writer's transactions. A connection that died since its last use (the
server restarted) fails its first statement instead, a disconnection: the pool drops its
connections, and the writer retries the transaction (`store_down`) on a new one, the API
runs a read again once (api/guards.py)."""


def _ping_after_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info["kvscope_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("kvscope_idle_since", None)
        if since is None or time.monotonic() - since <= PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the pool replaces the connection and checks out again
            raise DisconnectionError(f"an idle connection did not answer: {exc}") from exc


def alembic_config() -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


MIGRATION_LOCK = 0x6B7673636F7065  # "kvscope": PostgreSQL's advisory lock key for migrations


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations up to `revision` (idempotent).

    Processes that open one new store at once take turns: each would otherwise read "no
    schema" and create the same tables. The lock is held until the migrations commit, and the
    next process then finds the store at `revision`.
    """
    config = alembic_config()
    with engine.begin() as connection:
        if engine.dialect.name == "sqlite":
            # pysqlite begins lazily, and DDL alone would not take the write lock.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        elif engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def schema_revisions(engine: Engine) -> tuple[str | None, str]:
    """(the store's schema revision, the one this kvscope writes)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision(), head


def open_store(url: str = DEFAULT_STORE, read_only: bool = False) -> Engine:
    """An engine on the store at `url`, its schema migrated to head.

    `read_only`: the caller only reads. Nothing is migrated or created: a store at another
    revision, or none at all, is a `StoreError` that says what to do.
    """
    engine = make_engine(url, read_only)
    if not read_only:
        upgrade(engine)
        return engine
    try:
        current, head = schema_revisions(engine)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read the store: {str(exc).splitlines()[0]}") from exc
    if current is None:
        raise StoreError("no kvscope store there (no schema: `kvscope db upgrade` makes one)")
    if current != head:
        raise StoreError(
            f"the store's schema is at revision {current}, this kvscope reads {head}: "
            "run `kvscope db upgrade` with write access"
        )
    return engine


def store_down(exc: BaseException) -> bool:
    """Whether `exc` says the store cannot be reached or used now (a connection refused or
    lost, a file that cannot be opened, a pool with no free connection), not that a statement
    is wrong (those are bugs: 500)."""
    if isinstance(exc, DisconnectionError | PoolTimeout):
        return True
    return isinstance(exc, DBAPIError) and not isinstance(
        exc, ProgrammingError | IntegrityError | DataError | NotSupportedError
    )
