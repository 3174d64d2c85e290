"""The writer's many-row statements (storage/bulk_sql.py) store each value exactly, and on
PostgreSQL send each column as one array in binary, made in C, not a list that psycopg dumps
element by element in Python nor numbers formatted as text."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select

from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.bulk_sql import insert_log, upsert_rows
from kvscope.storage.engine import open_store
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.pg_arrays import BinaryArray
from kvscope.storage.rows import RollupRow

POINTS = [
    (1, 0.1, 0, 2**31 - 1, -(2**31), 1 / 3, 5e-324),
    (1, 2, 7, 8, 9, 1.7976931348623157e308, -0.0),
    (1, 1e-300, 1, 1, 1, 1e16, 123456789.123456789),
]
TRICKY = ['a,"b}{', "NULL", "", "back\\slash", "é ü"]


def _reset(conn: Any) -> int:
    conn.execute(schema.streams.insert().values(id=1, replica="r", rank=0))
    conn.execute(
        schema.resets.insert().values(
            id=1,
            stream_id=1,
            epoch=0,
            seq=0,
            ts=0.0,
            reason="r",
            degraded=False,
            before_blocks=0,
            before_hittable=0,
            before_orphans=0,
            before_tokens=0,
            before=b"",
        )
    )
    return 1


def test_values_come_back_exactly(store_url: str) -> None:
    engine = open_store(store_url)
    groups = [
        (1, i, medium, i, f"{i:x}", i, 2**40 + i, i, None if i % 2 else i / 7, medium, None)
        for i, medium in enumerate(TRICKY)
    ]
    with engine.begin() as conn:
        _reset(conn)
        upsert_rows(conn, schema.reset_recovery, ("reset_id", "offset_s"), POINTS)
        upsert_rows(conn, schema.reset_prefix_groups, ("reset_id", "position"), groups)
        # Written again, changed: the rows under the key are overwritten.
        again = [(*p[:2], p[2] + 1, *p[3:]) for p in POINTS]
        upsert_rows(conn, schema.reset_recovery, ("reset_id", "offset_s"), again)
    with engine.connect() as conn:
        rr, g = schema.reset_recovery, schema.reset_prefix_groups
        points = [tuple(r) for r in conn.execute(select(rr).order_by(rr.c.offset_s))]
        stored = [tuple(r) for r in conn.execute(select(g).order_by(g.c.position))]
    assert points == sorted((tuple(p) for p in again), key=lambda p: p[1])
    assert [type(p[1]) for p in points] == [float] * len(points)
    assert stored == groups
    engine.dispose()


def test_each_column_goes_as_one_binary_array(pg_url: str) -> None:
    engine = open_store(pg_url)
    sent: list[tuple[Any, ...]] = []

    def executed(*args: Any) -> None:
        if "reset_recovery" in args[2]:
            sent.append(args[3])

    event.listen(engine, "before_cursor_execute", executed)
    with engine.begin() as conn:
        _reset(conn)
        upsert_rows(conn, schema.reset_recovery, ("reset_id", "offset_s"), POINTS)
    event.remove(engine, "before_cursor_execute", executed)
    assert len(sent) == 1
    assert len(sent[0]) == len(schema.reset_recovery.columns)
    assert all(isinstance(column, BinaryArray) for column in sent[0])
    engine.dispose()


def test_the_log_asks_no_stream_id_it_is_given(pg_url: str) -> None:
    """The writer's cached ids go with the log's rows: the arrays look each stream up there,
    in C, and ask for none of them."""
    stream = StreamId("a", 0)
    chunks = pack([(stream, 0, seq, 1.0 + seq, 2.0 + seq, b"x" * 50) for seq in range(5)])
    rollup = RollupRow(stream, 7, "gpu", 0, 1, 2, 3, 4, 5, 6, 7)
    engine = open_store(pg_url)

    def ask(_: StreamId) -> int:
        raise AssertionError("asked for an id it was given")

    with engine.begin() as conn:
        conn.execute(schema.streams.insert().values(id=9, replica="a", rank=0))
        insert_log(conn, chunks, [rollup], ask, {stream: 9})
    with engine.connect() as conn:
        assert conn.execute(select(schema.log_chunks.c.stream_id)).scalars().all() == [9]
        assert conn.execute(select(schema.rollups.c.stream_id)).scalars().all() == [9]
    engine.dispose()
