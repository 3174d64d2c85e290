"""Migrations 0010 (map snapshots as byte planes) and 0012 (without repeats) on a real SQLite file
and the real PostgreSQL: up re-writes every checkpoint and reset "before" in the new format, down
in the one before, and each still restores the same map; bytes that are no snapshot are left
alone."""

from __future__ import annotations

import pytest
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


def _insert_snapshots(engine: sa.Engine, sid: int, maps: list[PrefixMap], version: int) -> None:
    """Two checkpoints, a reset's "before" and a reset whose "before" is no snapshot."""
    with engine.begin() as conn:
        for seq, prefix_map in enumerate(maps[:2]):
            conn.execute(
                sa.insert(schema.checkpoints).values(
                    stream_id=sid,
                    epoch=0,
                    seq=seq,
                    ts=1.0,
                    blocks=1,
                    snapshot=encode_map(prefix_map, version=version),
                )
            )
        for seq, before in ((9, encode_map(maps[2], version=version)), (20, b"not a snapshot")):
            conn.execute(
                sa.insert(schema.resets).values(
                    stream_id=sid,
                    epoch=0,
                    seq=seq,
                    ts=2.0,
                    reason="all_blocks_cleared",
                    degraded=False,
                    before_blocks=0,
                    before_hittable=0,
                    before_orphans=0,
                    before_tokens=0,
                    before=before,
                )
            )


def _assert_stored(engine: sa.Engine, maps: list[PrefixMap], version: int) -> None:
    stored = _stored(engine)
    assert [snapshot_version(data) for data in stored] == [version] * 3
    assert [state_of(decode_map(d, STREAM)) for d in stored] == [state_of(m) for m in maps]


@pytest.mark.parametrize(
    ("before", "migration", "old", "new"), [("0009", "0010", 1, 2), ("0011", "0012", 2, 3)]
)
def test_a_snapshot_migration_rewrites_every_snapshot_and_back(
    store_url: str, before: str, migration: str, old: int, new: int
) -> None:
    maps = [_map(30), _map(7), _map(12)]
    engine, sid = store_at(store_url, before)
    _insert_snapshots(engine, sid, maps, old)
    upgrade(engine, migration)
    _assert_stored(engine, maps, new)
    downgrade(engine, before)
    _assert_stored(engine, maps, old)
    upgrade(engine)  # and up again: 0017 leaves format 3 (5 is written from then on)
    _assert_stored(engine, maps, max(new, 3))
    engine.dispose()
