"""Migration 0022: PostgreSQL keeps the blobs the writer compressed itself as they are (no pglz
over zstd frames); SQLite has no such setting and is left as it was."""

from __future__ import annotations

import sqlalchemy as sa

from kvscope.storage.engine import open_store
from tests.migration_support import downgrade

COMPRESSED = {
    ("log_chunks", "data"),
    ("log_dictionaries", "data"),
    ("checkpoints", "snapshot"),
    ("resets", "before"),
}


def _storage(engine: sa.Engine) -> dict[tuple[str, str], str]:
    """PostgreSQL's storage of each compressed column ('e' EXTERNAL, 'x' EXTENDED)."""
    query = sa.text(
        "SELECT c.relname, a.attname, a.attstorage FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname = :t AND a.attname = :c"
    )
    found = {}
    with engine.connect() as conn:
        for table, column in COMPRESSED:
            row = conn.execute(query, {"t": table, "c": column}).one()
            found[(row[0], row[1])] = row[2]
    return found


def test_0022_stores_compressed_columns_external_on_postgresql_and_down_undoes_it(
    pg_url: str,
) -> None:
    engine = open_store(pg_url)
    assert set(_storage(engine).values()) == {"e"}
    downgrade(engine, "0021")
    assert set(_storage(engine).values()) == {"x"}
    open_store(pg_url)
    assert set(_storage(engine).values()) == {"e"}
    engine.dispose()


def test_0022_down_and_up_leaves_sqlite_as_it_was(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/kvscope.sqlite"
    engine = open_store(url)
    with engine.connect() as conn:
        before = conn.exec_driver_sql("SELECT sql FROM sqlite_master ORDER BY name").all()
    downgrade(engine, "0021")
    open_store(url)
    with engine.connect() as conn:
        after = conn.exec_driver_sql("SELECT sql FROM sqlite_master ORDER BY name").all()
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == "0022"
    assert after == before
    engine.dispose()
