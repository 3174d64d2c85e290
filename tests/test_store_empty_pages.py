"""A new SQLite store's fixed cost: a page per table and index, before anything is written.
A lab recording of a few minutes stores a few hundred kilobytes of content in all
(benchmarks/store.py); the empty pages must not outweigh it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from kvscope.storage.engine import open_store

CONTENT_OF_A_SHORT_RECORDING = 200_000
"""About the bytes a three-minute lab recording's distinct content weighs at its floor
(benchmarks/_content_floor.py on kvscope/data/lab_3rps_180s)."""


def test_a_new_store_weighs_under_a_short_recordings_content(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    open_store(f"sqlite:///{path}").dispose()
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    engine.dispose()
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert size < CONTENT_OF_A_SHORT_RECORDING
