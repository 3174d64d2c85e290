"""Migration 0010 (map snapshots as byte planes) on a real SQLite file and the real PostgreSQL:
up re-writes every checkpoint and reset "before" in format 2, down in format 1, and each still
restores the same map; bytes that are no snapshot are left alone."""

from __future__ import annotations

import sqlalchemy as sa

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import decode_map, encode_map, snapshot_version
from kvscope.collector.types import Batch, StreamId
from kvscope.storage import schema
from kvscope.storage.engine import upgrade
from tests.migration_support import downgrade, store_at
from tests.test_prefix_map import stored
from tests.test_snapshot import state_of

STREAM = StreamId("a", 0)


def _map(blocks: int) -> PrefixMap:
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored(list(range(1, blocks + 1)), None)]))
    return prefix_map


def _stored(engine: sa.Engine) -> list[bytes]:
    with engine.connect() as conn:
        c = schema.checkpoints
        snapshots = conn.execute(sa.select(c.c.snapshot).order_by(c.c.seq)).scalars().all()
        befores = (
            conn.execute(sa.select(schema.resets.c.before).order_by(schema.resets.c.seq))
            .scalars()
            .all()
        )
    assert bytes(befores[-1]) == b"not a snapshot"
    return [bytes(data) for data in (*snapshots, *befores[:-1])]


def test_0010_rewrites_snapshots_as_byte_planes_and_back(store_url: str) -> None:
    maps = [_map(30), _map(7), _map(12)]
    engine, sid = store_at(store_url, "0009")
    with engine.begin() as conn:
        for seq, prefix_map in enumerate(maps[:2]):
            conn.execute(
                sa.insert(schema.checkpoints).values(
                    stream_id=sid,
                    epoch=0,
                    seq=seq,
                    ts=1.0,
                    blocks=1,
                    snapshot=encode_map(prefix_map, version=1),
                )
            )
        conn.execute(
            sa.insert(schema.resets).values(
                stream_id=sid,
                epoch=0,
                seq=9,
                ts=2.0,
                reason="all_blocks_cleared",
                degraded=False,
                before_blocks=12,
                before_hittable=12,
                before_orphans=0,
                before_tokens=192,
                before=encode_map(maps[2], version=1),
            )
        )
        conn.execute(
            sa.insert(schema.resets).values(
                stream_id=sid,
                epoch=0,
                seq=20,
                ts=3.0,
                reason="all_blocks_cleared",
                degraded=False,
                before_blocks=0,
                before_hittable=0,
                before_orphans=0,
                before_tokens=0,
                before=b"not a snapshot",
            )
        )
    upgrade(engine)
    after = _stored(engine)
    assert [snapshot_version(data) for data in after] == [2, 2, 2]
    assert [state_of(decode_map(d, STREAM)) for d in after] == [state_of(m) for m in maps]

    downgrade(engine, "0009")
    back = _stored(engine)
    assert [snapshot_version(data) for data in back] == [1, 1, 1]
    assert [state_of(decode_map(d, STREAM)) for d in back] == [state_of(m) for m in maps]
    upgrade(engine)  # and up again
    engine.dispose()
