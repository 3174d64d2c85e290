"""A SQLite store's free pages handed back to the file system while the writer idles
(storage/free_pages.py): re-packed chunks and pruned rows leave pages free inside the file,
which a new store (auto_vacuum=INCREMENTAL, storage/engine.py) gives back a step at a time; a
store made before keeps its pages, untouched."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import sqlalchemy as sa

from kvscope.storage.engine import open_store
from kvscope.storage.free_pages import FreePages
from kvscope.storage.rows import Row
from tests.test_log_dictionary import block_log, token_pool
from tests.test_log_dictionary_store import row_writer
from tests.test_log_repack import chunk_dictionaries, idle, stopped_loop


def free_pages(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())


def filler(engine: sa.Engine, rows: int) -> None:
    """`rows` rows of 4 KiB in a table of their own, then all of them deleted: pages free."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE filler (b BLOB)")
        for _ in range(rows):
            conn.exec_driver_sql("INSERT INTO filler VALUES (randomblob(4096))")
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM filler")


def filled_store(tmp_path: Path, rows: int = 1000) -> sa.Engine:
    """A new store with `rows` pages' worth of rows deleted: free pages to give back."""
    engine = open_store(f"sqlite:///{tmp_path / 'kv.db'}")
    filler(engine, rows)
    return engine


def told_freed(pages: FreePages) -> FreePages:
    """`pages`, told pages were freed: its next step gives them back."""
    pages.freed()
    return pages


def test_a_new_sqlite_store_gives_free_pages_back_a_step_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "kv.db"
    engine = open_store(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar_one() == 2  # incremental
    filler(engine, 3000)
    freed = free_pages(engine)
    assert freed > 3000
    pages = FreePages(kept=64, per_step=1000)
    pages.freed()
    assert pages.pending
    steps = 0
    while pages.pending:
        with engine.begin() as conn:
            given = pages.step(conn)
        steps += 1
        assert given <= 1000
    assert steps >= freed // 1000
    assert free_pages(engine) <= 64
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    assert path.stat().st_size < freed * 4096 // 2
    engine.dispose()


def test_a_store_made_before_keeps_its_pages_untouched(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # auto_vacuum off, as stores were made before
        old.execute("CREATE TABLE made_before (x INTEGER)")
    engine = open_store(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar_one() == 0
    filler(engine, 500)
    freed = free_pages(engine)
    pages = FreePages(kept=64, per_step=1000)
    pages.freed()
    with engine.begin() as conn:
        assert pages.step(conn) == 0
    assert not pages.pending
    pages.freed()
    assert not pages.pending  # never again: it has none to give
    assert free_pages(engine) == freed
    engine.dispose()


def test_postgresql_is_left_to_its_own_vacuum(pg_url: str) -> None:
    engine = open_store(pg_url)
    pages = FreePages()
    pages.freed()
    with engine.begin() as conn:
        assert pages.step(conn) == 0
    pages.freed()
    assert not pages.pending
    engine.dispose()


def test_pages_freed_by_re_packing_go_back_once_the_writer_idles(tmp_path: Path) -> None:
    path = tmp_path / "kv.db"
    engine = open_store(f"sqlite:///{path}")
    # Chunks of 200 batches of varied content: a re-packed one frees whole pages.
    rows = block_log(random.Random(5), 8000, token_pool(random.Random(5), 2000))
    writer = row_writer()
    loop = stopped_loop(engine, writer)
    loop.free_pages = FreePages(kept=0)  # a small store: every page freed goes back
    for start in range(0, len(rows), 200):
        loop._write_rows(list[Row](rows[start : start + 200]))
    with engine.connect() as conn:
        assert None in chunk_dictionaries(conn)
    idle(loop)
    with engine.connect() as conn:
        assert None not in chunk_dictionaries(conn)
    assert not loop.idle_work
    assert loop.stats.idle_pages > 0
    assert free_pages(engine) == 0
    engine.dispose()


def test_a_step_gives_back_the_pages_it_counts(tmp_path: Path) -> None:
    # SQLite's incremental_vacuum frees one page per row it steps through: a step that does
    # not read them all gives back one page, whatever it counts.
    engine = filled_store(tmp_path)
    before = free_pages(engine)
    pages = told_freed(FreePages(kept=64, per_step=500))
    with engine.begin() as conn:
        given = pages.step(conn)
    assert given == 500
    assert free_pages(engine) == before - given
    engine.dispose()


def test_the_writer_shows_idle_work_between_re_packing_and_pages(tmp_path: Path) -> None:
    # flush(idle_work=True) reads `idle_work` from another thread: the pages a last re-packing
    # step freed must be pending before that step's work stops showing.
    engine = open_store(f"sqlite:///{tmp_path / 'kv.db'}")
    rows = block_log(random.Random(5), 8000, token_pool(random.Random(5), 2000))
    loop = stopped_loop(engine, row_writer())
    loop.free_pages = FreePages(kept=0)
    loop.sql.repack.per_step = 1000  # one step re-packs them all: no earlier step freed pages
    for start in range(0, len(rows), 200):
        loop._write_rows(list[Row](rows[start : start + 200]))
    seen: list[bool] = []
    ended = loop.sql.idle_ended

    def idle_ended(committed: bool) -> None:
        ended(committed)
        seen.append(loop.idle_work)  # what another thread may read next

    loop.sql.idle_ended = idle_ended  # type: ignore[method-assign]
    idle(loop)
    assert loop.stats.idle_pages > 0
    assert seen and all(seen)
    engine.dispose()


def test_a_step_is_one_transaction(tmp_path: Path) -> None:
    # The driver runs a pragma outside any transaction: each page given back was a commit of
    # its own (the step several times slower), not the one short transaction it is meant to be.
    engine = filled_store(tmp_path)
    before = free_pages(engine)
    pages = told_freed(FreePages(kept=64, per_step=500))
    with engine.begin() as conn:
        assert pages.step(conn) == 500
        assert free_pages(engine) == before  # another connection sees none of it yet
    assert free_pages(engine) == before - 500
    engine.dispose()


def test_a_connection_opens_while_the_writer_holds_its_transaction(tmp_path: Path) -> None:
    # Setting auto_vacuum on a file that has tables takes the write lock, even to change
    # nothing: done at every connect, a reader's new connection waited out the writer's
    # transaction (up to the busy timeout, then "database is locked").
    path = tmp_path / "kv.db"
    writer = open_store(f"sqlite:///{path}")
    with writer.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    reader = open_store(f"sqlite:///{path}")
    reader.pool.dispose()
    with writer.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")  # the write lock, held
        with reader.connect() as other:
            assert other.exec_driver_sql("SELECT count(*) FROM t").scalar_one() == 0
    with reader.connect() as other:
        assert other.exec_driver_sql("PRAGMA auto_vacuum").scalar_one() == 2  # a new store
    reader.dispose()
    writer.dispose()


def test_a_step_that_gives_back_nothing_waits_for_the_next_check(tmp_path: Path) -> None:
    # Were SQLite ever to free none of the pages counted, the writer's idle steps must not
    # spin on them: nothing is pending until the next check is due.
    class GivesNothing(FreePages):
        def _give_back(self, conn: sa.Connection, pages: int) -> None:
            pass

    engine = filled_store(tmp_path)
    pages = told_freed(GivesNothing(kept=64, per_step=500))
    with engine.begin() as conn:
        assert pages.step(conn) == 0
    assert not pages.pending
    pages.freed()  # freed again: looked at again
    assert pages.pending
    engine.dispose()
