"""Migration 0014 (delta checkpoints) on a real SQLite file and the real PostgreSQL: down
re-writes each delta as the whole snapshot of the same map, or drops it where its key is gone,
so that the code before it rebuilds exactly; up again adds the column, every row a key."""

from __future__ import annotations

import random

import sqlalchemy as sa

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import copy_map, decode_map, snapshot_version
from kvscope.collector.snapshot_delta import encode_delta, encode_key
from kvscope.collector.types import Batch, StreamId
from kvscope.storage import schema
from kvscope.storage.engine import upgrade
from tests.migration_support import downgrade, store_at
from tests.test_prefix_map import stored
from tests.test_snapshot import state_of

STREAM = StreamId("a", 0)


def _rows(sid: int) -> tuple[list[dict[str, object]], dict[int, object]]:
    """A key at seq 1 and deltas on it at 2 and 3, a delta at 5 on a key (4) not stored; the
    map each holds, by seq."""
    rng = random.Random(5)
    prefix_map = PrefixMap(STREAM)
    rows: list[dict[str, object]] = []
    maps: dict[int, object] = {}
    held = {}
    for seq in range(1, 6):
        hashes = [rng.getrandbits(62) + 1 for _ in range(40)]
        prefix_map.apply(Batch(seq, float(seq), 0, [stored(hashes, None)]))
        if seq in (1, 4):
            data, held[seq] = encode_key(copy_map(prefix_map))
            key_seq = None
        else:
            key_seq = 1 if seq < 4 else 4
            data = encode_delta(copy_map(prefix_map), held[key_seq])  # type: ignore[assignment]
        maps[seq] = state_of(prefix_map)
        if seq != 4:
            rows.append(
                {"stream_id": sid, "epoch": 0, "seq": seq, "ts": float(seq), "blocks": 40}
                | {"snapshot": data, "key_seq": key_seq}
            )
    return rows, maps


def _stored(engine: sa.Engine) -> dict[int, bytes]:
    with engine.connect() as conn:
        c = sa.Table("checkpoints", sa.MetaData(), autoload_with=conn)
        return {r.seq: bytes(r.snapshot) for r in conn.execute(sa.select(c.c.seq, c.c.snapshot))}


def test_down_rewrites_deltas_whole_and_up_adds_the_column_back(store_url: str) -> None:
    engine, sid = store_at(store_url, "0014")
    rows, maps = _rows(sid)
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.checkpoints), rows)
    downgrade(engine, "0013")
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("checkpoints")}
    assert "key_seq" not in columns
    stored = _stored(engine)
    assert sorted(stored) == [1, 2, 3]  # the delta whose key is gone is dropped
    assert all(snapshot_version(data) == 3 for data in stored.values())
    assert {s: state_of(decode_map(d, STREAM)) for s, d in stored.items()} == {
        s: maps[s] for s in stored
    }
    upgrade(engine)
    with engine.connect() as conn:
        c = schema.checkpoints
        assert conn.execute(sa.select(c.c.key_seq).where(c.c.key_seq.is_not(None))).all() == []
    assert _stored(engine) == stored
    engine.dispose()
