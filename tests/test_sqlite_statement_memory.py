"""A SQLite store's connections hold no copy of what a finished statement wrote
(storage/engine.py)."""

from __future__ import annotations

import _sqlite3
import ctypes
from pathlib import Path

from kvscope.storage.engine import make_engine

BLOB = 8 << 20
"""As large as a large map's checkpoint."""


def _sqlite_heap() -> int:
    lib = ctypes.CDLL(_sqlite3.__file__)
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used())


def test_a_written_blob_is_not_held_after_its_transaction(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.sqlite'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (b BLOB)")
    before = _sqlite_heap()
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (?)", (bytes(BLOB),))
    # A cached statement kept its last bound values: the blob's copy, until the statement was
    # finalized or bound again.
    assert _sqlite_heap() - before < BLOB // 2
    engine.dispose()
