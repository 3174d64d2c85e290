"""Delta checkpoints in the store (a real SQLite file and the real PostgreSQL): every instant
rebuilds hash for hash from one key and at most one delta; retention keeps the keys its deltas
need; a delta whose key is gone makes its instants unknown, never wrong."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import delete, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, FanOut, NullSink
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import NotInStore, position_at_seq, rebuild, stream_id
from kvscope.storage.retention import Retention, prune
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_snapshot import state_of
from tests.test_store import STREAM

# Deltas whatever their size: every checkpoint after a key is one.
ALWAYS_DELTAS = StoreSettings(checkpoint_every_batches=300, checkpoint_delta_share=1e9)


def _ingest(store_url: str, sample_every: int) -> dict[int, object]:
    """The lab capture through the live path into the store; the live map, hash for hash, at
    seqs drawn with a fixed seed."""
    writer = StoreWriter(open_store(store_url), ALWAYS_DELTAS)
    samples: dict[int, object] = {}
    rng = random.Random(3)

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if rng.randrange(sample_every) == 0:
                samples[batch.seq] = state_of(ingest.map)

    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(writer, Sample()))
    for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    assert writer.stats.batches_dropped == 0
    return samples


def _checkpoints(conn: object) -> list[tuple[int, int | None]]:
    c = schema.checkpoints
    return [tuple(r) for r in conn.execute(select(c.c.seq, c.c.key_seq).order_by(c.c.seq))]  # type: ignore[attr-defined]


def test_every_instant_rebuilds_from_a_key_and_at_most_one_delta(store_url: str) -> None:
    samples = _ingest(store_url, 25)
    with open_store(store_url).connect() as conn:
        checkpoints = _checkpoints(conn)
        keys = {seq for seq, key_seq in checkpoints if key_seq is None}
        deltas = [key_seq for _, key_seq in checkpoints if key_seq is not None]
        assert len(deltas) >= 10 and set(deltas) <= keys  # a delta's key is never a delta
        sid = stream_id(conn, STREAM.replica)
        assert len(samples) > 200
        for seq, live in samples.items():
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert state_of(rebuilt.map) == live, seq
            assert rebuilt.unknown_because == []


def test_retention_keeps_the_keys_its_deltas_need(store_url: str) -> None:
    samples = _ingest(store_url, 40)
    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        ts_of = {b.batch.seq: b.batch.ts for b in batch_log.all_batches(conn, sid)}
    last_ts = max(ts_of.values())
    cutoff = (min(ts_of.values()) + last_ts) / 2
    pruned = prune(engine, Retention(log_s=last_ts - cutoff, checkpoints_s=1.0), last_ts)
    assert pruned.checkpoints > 0
    with engine.connect() as conn:
        checkpoints = _checkpoints(conn)
        kept = {seq for seq, _ in checkpoints}
        assert all(key_seq in kept for _, key_seq in checkpoints if key_seq is not None)
        inside = [seq for seq in samples if ts_of[seq] >= cutoff]
        assert len(inside) > 20
        for seq in inside:
            assert (
                state_of(rebuild(conn, position_at_seq(conn, sid, seq), STREAM).map)
                == (samples[seq])
            )


def test_a_delta_whose_key_is_gone_cannot_be_known(store_url: str) -> None:
    _ingest(store_url, 10**9)
    engine = open_store(store_url)
    with engine.begin() as conn:
        seq, key_seq = next((s, k) for s, k in _checkpoints(conn) if k is not None)
        c = schema.checkpoints
        conn.execute(delete(c).where(c.c.seq == key_seq))
    with engine.connect() as conn:
        position = position_at_seq(conn, stream_id(conn, STREAM.replica), seq)
        with pytest.raises(NotInStore, match="cannot be known"):
            rebuild(conn, position, STREAM)
