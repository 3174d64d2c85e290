"""A PostgreSQL database of its own for one benchmark run, dropped after it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

PG_ADMIN = os.environ.get(
    "KVSCOPE_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A new database named `prefix` + a random suffix on `PG_ADMIN`'s server; its name."""
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def database_url(name: str) -> str:
    """`PG_ADMIN` with database `name`, password kept."""
    return make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
