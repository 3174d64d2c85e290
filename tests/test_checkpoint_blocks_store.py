"""Checkpoints that number their stream's log dictionary's token blocks (snapshot format 5), in a
real store (SQLite file and PostgreSQL): rebuilt through the dictionary, which retention keeps
while a kept checkpoint names it; migration 0017 down writes them holding their blocks."""

from __future__ import annotations

import random

import msgspec
import sqlalchemy as sa

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import AppliedBatch, NullSink
from kvscope.collector.snapshot import blocks_named, decode_map, encode_map, snapshot_version
from kvscope.collector.types import Batch
from kvscope.storage import schema
from kvscope.storage.checkpoint_blocks import known_of
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.log_dictionaries_sql import insert_dictionaries
from kvscope.storage.log_dictionary import Dictionary, row_of
from kvscope.storage.retention import Retention, prune
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.migration_support import column_down_and_up, downgrade, store_at
from tests.test_log_dictionary import token_pool
from tests.test_log_dictionary_store import retokened
from tests.test_prefix_map import stored
from tests.test_snapshot import state_of
from tests.test_store import STREAM


def _frames() -> list[tuple[list[bytes], float]]:
    """A lab recording whose prompts recur (what dictionaries are for), from another pool of
    prompts in each third: its dictionary changes."""
    records = list(read_capture(capture_path("lab_10rps_300s.msgpack.gz")))
    pools = [token_pool(random.Random(seed), 200) for seed in range(3)]
    return [
        (retokened(r.frames, pools[3 * i // len(records)]), r.recv_ts)
        for i, r in enumerate(records)
    ]


def _write(store_url: str) -> None:
    """The recording written with a checkpoint every 700 batches."""
    settings = StoreSettings(
        checkpoint_every_batches=700,
        rows_per_transaction=300,
        log_dictionary_ratio=0.5,
        log_dictionary_bytes=40_000,
    )
    writer = StoreWriter(open_store(store_url), settings)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for frames, recv_ts in _frames():
        ingest.live_frames(frames, recv_ts)
    writer.close()
    assert writer.stats.batches_dropped == 0


def _live(seqs: set[int]) -> dict[int, object]:
    """The map's state after each batch of `seqs`, ingested again without a store."""
    live: dict[int, object] = {}

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if batch.seq in seqs:
                live[batch.seq] = state_of(ingest.map)

    ingest = StreamIngest(STREAM, can_replay=False, sink=Sample())
    for frames, recv_ts in _frames():
        ingest.live_frames(frames, recv_ts)
    return live


def _checkpoints(conn: sa.Connection) -> list[tuple[int, bytes]]:
    c = schema.checkpoints
    rows = conn.execute(sa.select(c.c.seq, c.c.snapshot).order_by(c.c.seq)).all()
    return [(int(seq), bytes(data)) for seq, data in rows]


def _stored_digests(conn: sa.Connection) -> set[bytes]:
    d = schema.log_dictionaries
    return {bytes(x) for x in conn.execute(sa.select(d.c.digest)).scalars()}


def test_checkpoints_name_the_dictionary_and_rebuild_through_it_past_retention(
    store_url: str,
) -> None:
    _write(store_url)
    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        checkpoints = _checkpoints(conn)
    live = _live({seq for seq, _ in checkpoints})
    with engine.connect() as conn:
        named = {seq: blocks_named(data) for seq, data in checkpoints}
        assert len({name for name in named.values() if name is not None}) >= 2
        for seq, _ in checkpoints:
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert rebuilt.from_checkpoint_seq == seq and rebuilt.batches_replayed == 0
            assert state_of(rebuilt.map) == live[seq], seq
    # Past retention, the checkpoint kept rebuilds still.
    with engine.connect() as conn:
        cutoff = conn.execute(sa.select(sa.func.max(schema.log_chunks.c.max_ts))).scalar_one()
    prune(engine, Retention(log_s=1.0, checkpoints_s=None, rollups_s=None), cutoff + 1.5)
    with engine.connect() as conn:
        kept = _checkpoints(conn)
        assert kept and {blocks_named(data) for _, data in kept} <= _stored_digests(conn)
        rebuilt = rebuild(conn, position_at_seq(conn, sid, kept[-1][0]), STREAM)
        assert state_of(rebuilt.map) == live[kept[-1][0]]
    engine.dispose()


def test_retention_keeps_a_dictionary_while_a_checkpoint_names_it(store_url: str) -> None:
    """Named by no chunk and not the stream's newest, it stays while a checkpoint names it."""
    engine, sid = store_at(store_url, "head")
    tokens = [random.Random(3).randrange(128) for _ in range(16 * 29)]  # one byte in msgpack
    event = msgspec.structs.replace(stored(list(range(1, 30)), None), token_ids=tokens)
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [msgspec.structs.replace(event, block_size=16)]))
    old, new = Dictionary(bytes(tokens)), Dictionary(b"\x02" * 64)
    rows = [row_of(STREAM, d, made_at) for d, made_at in ((old, 1.0), (new, 2.0))]
    with engine.begin() as conn:
        insert_dictionaries(conn, rows, lambda _: sid)
        conn.execute(
            sa.insert(schema.checkpoints).values(
                stream_id=sid,
                epoch=0,
                seq=5,
                ts=3.0,
                blocks=29,
                snapshot=encode_map(prefix_map, known=known_of(old)),
                dictionary=old.digest,  # as the writer names it (test_each_checkpoint_...)
            )
        )
    retention = Retention(log_s=1.0, checkpoints_s=None, rollups_s=None)
    assert prune(engine, retention, 10.0).dictionaries == 0
    with engine.begin() as conn:
        assert _stored_digests(conn) == {old.digest, new.digest}
        conn.execute(sa.delete(schema.checkpoints))
    assert prune(engine, retention, 10.0).dictionaries == 1
    with engine.connect() as conn:
        assert _stored_digests(conn) == {new.digest}
    engine.dispose()


def _columns_and_names(engine: sa.Engine) -> list[tuple[bytes | None, bytes | None]]:
    c = schema.checkpoints
    with engine.connect() as conn:
        rows = conn.execute(sa.select(c.c.dictionary, c.c.snapshot).order_by(c.c.seq))
        return [(None if d is None else bytes(d), blocks_named(bytes(s))) for d, s in rows]


def test_each_checkpoint_names_its_dictionary_in_a_column(store_url: str) -> None:
    """Retention keeps a dictionary while a checkpoint names it: it reads the names from a
    column, not from every checkpoint's bytes at every prune."""
    _write(store_url)
    engine = open_store(store_url)
    names = _columns_and_names(engine)
    assert any(name is not None for _, name in names)
    assert all(column == name for column, name in names)
    engine.dispose()


def test_0021_up_fills_the_name_column_from_the_checkpoints_and_down_drops_it(
    store_url: str,
) -> None:
    _write(store_url)
    engine = open_store(store_url)
    column_down_and_up(engine, "0020", "checkpoints", "dictionary", _columns_and_names)
    engine.dispose()


def test_0017_down_writes_checkpoints_holding_their_blocks(store_url: str) -> None:
    _write(store_url)
    engine = open_store(store_url)
    with engine.connect() as conn:
        before = _checkpoints(conn)
    live = _live({seq for seq, _ in before})
    assert any(blocks_named(data) for _, data in before)
    downgrade(engine, "0016")
    with engine.connect() as conn:
        after = _checkpoints(conn)
    assert [seq for seq, _ in after] == [seq for seq, _ in before]
    for seq, data in after:
        assert blocks_named(data) is None and snapshot_version(data) == 3
        assert state_of(decode_map(data, STREAM)) == live[seq]
    engine.dispose()
