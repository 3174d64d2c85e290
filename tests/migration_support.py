"""A store held at a schema revision, for the migration tests: up to it, a stream in it, down."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from kvscope.storage import schema
from kvscope.storage.engine import alembic_config, make_engine, upgrade


def store_at(url: str, revision: str) -> tuple[sa.Engine, int]:
    """The store at `url` migrated up to `revision`, with one stream (a/0): its id."""
    engine = make_engine(url)
    upgrade(engine, revision)
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
