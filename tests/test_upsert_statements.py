"""The writer's upserts are built once per table, key and columns, not once per row."""

from __future__ import annotations

from sqlalchemy import create_engine

from kvscope.storage import schema
from kvscope.storage.upsert import upsert_statement


def test_an_upsert_is_built_once_and_stays_the_tables() -> None:
    engine = create_engine("sqlite://")
    key = ("stream_id", "epoch", "seq")
    with engine.connect() as conn:
        first = upsert_statement(conn, schema.checkpoints, key)
        assert upsert_statement(conn, schema.checkpoints, key) is first
        assert first.table is schema.checkpoints
        some = upsert_statement(conn, schema.checkpoints, key, ["blocks", "ts"])
        assert upsert_statement(conn, schema.checkpoints, key, ["ts", "blocks"]) is some
        assert some is not first  # other columns overwritten: another statement
    engine.dispose()
