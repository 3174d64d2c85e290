"""The migration tests' steps: a store held at a schema revision (up to it, a stream in it),
taken down a revision and up again; and a batch log's round trip through a chunk format's
migration."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from alembic import command

from kvscope.storage import batch_log, schema
from kvscope.storage.engine import alembic_config, make_engine, upgrade
from kvscope.storage.log_chunks import FORMAT_2_MAGIC, Chunk
from kvscope.storage.log_columns import FORMAT_3_MAGIC, FORMAT_4_MAGIC, FORMAT_5_MAGIC
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow, Row
from kvscope.storage.sql_writer import RowWriter
from tests.test_log_dictionary import A, B, block_log, token_pool

MAGICS = (FORMAT_2_MAGIC, FORMAT_3_MAGIC, FORMAT_4_MAGIC, FORMAT_5_MAGIC)
"""What a stored chunk of format 2 and on begins with (format 1's begins with none of them)."""


def engine_at(url: str, revision: str) -> sa.Engine:
    """The store at `url`, migrated up to `revision`."""
    engine = make_engine(url)
    upgrade(engine, revision)
    return engine


def store_at(url: str, revision: str) -> tuple[sa.Engine, int]:
    """The store at `url` migrated up to `revision`, with one stream (a/0): its id."""
    engine = engine_at(url, revision)
    with engine.begin() as conn:
        sid = conn.execute(
            sa.insert(schema.streams).values(replica="a", rank=0).returning(schema.streams.c.id)
        ).scalar_one()
    return engine, int(sid)


def downgrade(engine: sa.Engine, revision: str) -> None:
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def column_down_and_up(
    engine: sa.Engine, below: str, table: str, column: str, read: Callable[[sa.Engine], object]
) -> None:
    """`column` of `table` is gone one revision down (at `below`), and up again what `read`
    finds is as before."""
    before = read(engine)
    downgrade(engine, below)
    with engine.connect() as conn:
        assert column not in {c["name"] for c in sa.inspect(conn).get_columns(table)}
    upgrade(engine)
    assert read(engine) == before


def write(engine: sa.Engine, writer: RowWriter, rows: list[LogRow], lost: bool = False) -> None:
    """One transaction of the writer's; `lost`: it fails (rolled back), as when the store
    refuses it for good."""
    prepared = writer.prepare(list[Row](rows))
    if not lost:
        with engine.begin() as conn:
            writer.write(conn, prepared)
        writer.committed(prepared)
        return
    with pytest.raises(RuntimeError), engine.begin() as conn:
        writer.write(conn, prepared)
        raise RuntimeError("rolled back")
    writer.forget_ids()


def stored_dictionaries(conn: sa.Connection) -> tuple[set[bytes], set[bytes]]:
    """The digests stored, and those the stored chunks name."""
    d, c = schema.log_dictionaries, schema.log_chunks
    have = {bytes(x) for x in conn.execute(sa.select(d.c.digest)).scalars()}
    named = conn.execute(sa.select(c.c.dictionary).where(c.c.dictionary.is_not(None)))
    return have, {bytes(x) for x in named.scalars()}


def _chunks(conn: sa.Connection) -> list[bytes]:
    query = sa.text("SELECT data FROM log_chunks ORDER BY epoch, first_seq")
    return [bytes(d) for d in conn.execute(query).scalars()]


def _magics(chunks: list[bytes]) -> set[bytes | None]:
    return {next((m for m in MAGICS if c.startswith(m)), None) for c in chunks}


def log_down_and_up(
    store_url: str,
    at: str,
    fmt: int,
    magics: set[bytes | None],
    down_magics: set[bytes | None],
    dictionaries_go: bool = False,
    second_stream: bool = False,
) -> None:
    """A log in chunk format `fmt`, held at revision `at` (its dictionaries formed as the writer
    goes), comes back the same batches one revision down and up again.
    Its chunks begin with `magics` before, `down_magics` after (None: format 1's, which have
    none). The dictionaries stay, named by the same chunks; with `dictionaries_go`, they go with
    their table and the chunks' column that names them. With `second_stream`, a stream with no
    dictionary yet is written too (the writer packs a stream's first chunks again once its first
    dictionary forms, so only such a stream keeps dictionary-less chunks). The log is written
    at the newest revision (whose writer writes columns `at` may lack), then the store taken
    down to `at`: the revisions above it re-write no chunk of `fmt`."""
    engine, sid = store_at(store_url, "head")
    pool = token_pool(random.Random(6), 40)
    rows = [(A, 0, *r[2:]) for r in block_log(random.Random(6), 400, pool)]
    writer = RowWriter(None, packer=LogPacker(ratio=0.5, fmt=fmt))
    for start in range(0, len(rows), 100):
        write(engine, writer, rows[start : start + 100])
    if second_stream:
        write(engine, writer, [(B, 0, *r[2:]) for r in block_log(random.Random(7), 100, pool)])
    downgrade(engine, at)
    with engine.connect() as conn:
        before = stored_dictionaries(conn)
        assert _magics(_chunks(conn)) == magics
    assert len(before[1]) > 0
    downgrade(engine, f"{int(at) - 1:04d}")
    with engine.connect() as conn:
        stored = _chunks(conn)
        if dictionaries_go:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("log_chunks")}
            assert "log_dictionaries" not in sa.inspect(conn).get_table_names()
            assert "dictionary" not in columns
            # The log's reader of today would ask for the column: the chunks are read alone.
            chunks = [Chunk(c) for c in stored]
            down = [tuple(c.batch(i)) for c in chunks for i in range(len(c))]
        else:
            assert stored_dictionaries(conn) == before  # the same dictionaries, still named
            down = [tuple(b.batch) for b in batch_log.all_batches(conn, sid)]
    assert _magics(stored) == down_magics
    assert down == [(r[2], r[3], r[4], r[5]) for r in rows]
    upgrade(engine)
    with engine.connect() as conn:
        again = [tuple(b.batch) for b in batch_log.all_batches(conn, sid)]
    assert again == down
    engine.dispose()
