"""Several collectors sharing one store, each writing its own streams."""

from __future__ import annotations

from sqlalchemy import Engine, insert, select, update

from kvscope.collector.types import StreamId
from kvscope.storage import schema


class ShardConflict(RuntimeError):
    """A stream is already written by another collector (another shard)."""


def claim_streams(engine: Engine, streams: list[StreamId], shard: str | None) -> None:
    """Record `shard` as the writer of `streams`, refusing streams another shard owns.

    Several collectors may share one PostgreSQL, each with its own replicas; two writers on one
    stream would interleave two logs, so that is refused before anything is written.
    """
    t = schema.streams
    with engine.begin() as conn:
        for stream in streams:
            row = conn.execute(
                select(t.c.id, t.c.shard).where(
                    t.c.replica == stream.replica, t.c.rank == stream.rank
                )
            ).first()
            if row is None:
                conn.execute(
                    insert(t).values(replica=stream.replica, rank=stream.rank, shard=shard)
                )
            elif row.shard not in (None, shard):
                raise ShardConflict(
                    f"{stream} is written by shard {row.shard!r}; this collector is "
                    f"{'unsharded' if shard is None else repr(shard)}"
                )
            elif row.shard is None and shard is not None:
                conn.execute(update(t).where(t.c.id == row.id).values(shard=shard))
