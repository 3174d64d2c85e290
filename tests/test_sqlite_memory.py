"""What a SQLite store's connections hold: no copy of a large blob the writer wrote
(storage/bulk_sql.py's `upsert_released`: a cached statement keeps the values last bound to it
until it is bound again, and a checkpoint's or a reset's map, or a log dictionary, is
megabytes), and a page cache smaller than SQLite's default (storage/engine.py)."""

from __future__ import annotations

import _sqlite3
import ctypes
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import copy_map
from kvscope.collector.types import Batch, StreamId
from kvscope.storage import schema
from kvscope.storage.engine import SQLITE_CACHE_KIB, open_store
from kvscope.storage.log_dictionaries_sql import insert_dictionaries
from kvscope.storage.log_dictionary import DictionaryRow
from kvscope.storage.rows import BeforeMap, CheckpointRow, ResetRow, Row
from kvscope.storage.sql_writer import RowWriter
from tests.test_prefix_map import stored

BLOB = 8 << 20
"""As large as a large map's checkpoint; four times SQLite's default page cache."""
STREAM = StreamId("a", 0)


def _sqlite_heap() -> int:
    lib = ctypes.CDLL(_sqlite3.__file__)
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used())


def _small_map() -> PrefixMap:
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 0.0, 0, [stored([11, 12], None)]))
    return prefix_map


def _small_copy() -> bytes:
    return copy_map(_small_map())


def _checkpoint(blob: bytes) -> Row:
    return CheckpointRow(STREAM, 0, 5, 5.0, 2, _small_copy(), packed=blob)


def _reset(blob: bytes) -> Row:
    before = BeforeMap(_small_map().tables)
    row = ResetRow(STREAM, (0, 5, "clear"), 5.0, 5.0, False, 2, 2, 0, 32, before)
    row.packed_before = blob
    return row


def _write(engine: sa.Engine, writer: RowWriter, rows: list[Row]) -> None:
    prepared = writer.prepare(rows)
    with engine.begin() as conn:
        writer.write(conn, prepared)
    writer.committed(prepared)


@pytest.mark.parametrize(
    ("make", "table", "column"),
    [(_checkpoint, schema.checkpoints, "snapshot"), (_reset, schema.resets, "before")],
)
def test_a_written_map_is_not_held_after_its_transaction(
    tmp_path: Path, make: Callable[[bytes], Row], table: sa.Table, column: str
) -> None:
    engine = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    writer = RowWriter(None)
    first, second = os.urandom(BLOB), os.urandom(BLOB)
    before = _sqlite_heap()
    _write(engine, writer, [make(first)])
    _write(engine, writer, [make(second)])  # the same row again, as a retry writes it
    assert _sqlite_heap() - before < BLOB // 2
    with engine.connect() as conn:
        assert conn.execute(sa.select(table.c[column])).scalars().all() == [second]
    engine.dispose()


def test_a_written_dictionary_is_not_held_after_its_transaction(tmp_path: Path) -> None:
    engine = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    rows = [DictionaryRow(STREAM, bytes([k]) * 16, 1.0 + k, BLOB, os.urandom(BLOB)) for k in (1, 2)]
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.streams).values(id=1, replica="a", rank=0))
    before = _sqlite_heap()
    with engine.begin() as conn:
        insert_dictionaries(conn, rows, lambda _stream: 1)
    with engine.begin() as conn:
        insert_dictionaries(conn, rows[:1], lambda _stream: 1)  # made again: made_at only
    assert _sqlite_heap() - before < BLOB // 2
    t = schema.log_dictionaries
    with engine.connect() as conn:
        got = conn.execute(sa.select(t.c.digest, t.c.made_at, t.c.data).order_by(t.c.digest))
        assert [tuple(r) for r in got] == [(r.digest, r.made_at, r.data) for r in rows]
    engine.dispose()


def test_a_store_connection_caches_fewer_pages_than_sqlites_default(tmp_path: Path) -> None:
    engine = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    with engine.connect() as conn:
        default = sqlite3.connect(":memory:").execute("PRAGMA cache_size").fetchone()[0]
        cache = conn.exec_driver_sql("PRAGMA cache_size").scalar_one()
    # Negative: KiB, not pages.
    assert default < 0 and cache < 0
    assert -cache == SQLITE_CACHE_KIB < -default // 2
    engine.dispose()


def test_a_dictionary_whose_write_failed_is_not_held(tmp_path: Path) -> None:
    """A write that fails (here its stream is missing; in an outage, a full disk) leaves no
    copy of its blob bound to the cached statement while the writer waits to retry."""
    engine = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    row = DictionaryRow(STREAM, bytes(16), 1.0, BLOB, os.urandom(BLOB))
    before = _sqlite_heap()
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        insert_dictionaries(conn, [row], lambda _stream: 99)  # no such stream
    assert _sqlite_heap() - before < BLOB // 2
    stored = sa.select(sa.func.count()).select_from(schema.log_dictionaries)
    with engine.connect() as conn:
        assert conn.execute(stored).scalar_one() == 0  # rolled back, as before
    engine.dispose()
