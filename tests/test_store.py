"""The store on a real SQLite file and the real PostgreSQL: the log, checkpoints and resets
rebuild every instant of vLLM's recorded streams exactly."""

from __future__ import annotations

import json
import random
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, FanOut, NullSink
from kvscope.collector.snapshot import decode_tables
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, position_at_time, rebuild, stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)


def test_migrations_create_exactly_the_schema(store_url: str) -> None:
    engine = open_store(store_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    assert diff == []
    open_store(store_url)  # a second upgrade is a no-op


def ingest_capture(
    store_url: str, name: str, settings: StoreSettings, sample_every: int = 0
) -> tuple[StoreWriter, dict[int, dict[tuple[int, int], int]], dict[str, Any]]:
    """Feed a capture through the live path with the store attached; sample the live map."""
    capture = capture_path(f"{name}.msgpack.gz")
    sidecar = json.loads(capture.with_name(f"{name}.json").read_text())
    writer = StoreWriter(open_store(store_url), settings)
    samples: dict[int, dict[tuple[int, int], int]] = {}
    rng = random.Random(7)

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if sample_every and rng.randrange(sample_every) == 0:
                samples[batch.seq] = ingest.map.counts()

    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(writer, Sample()))
    for record in read_capture(capture):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    return writer, samples, sidecar


def test_any_instant_rebuilds_to_the_live_map(store_url: str) -> None:
    settings = StoreSettings(checkpoint_every_batches=700)
    writer, samples, sidecar = ingest_capture(store_url, "lab_10rps_300s", settings, 60)
    assert writer.stats.batches_dropped == 0
    assert len(samples) > 50
    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, "lab")
        assert batch_log.count_batches(conn) == 7724
        checkpoints = conn.execute(select(func.count()).select_from(schema.checkpoints))
        assert checkpoints.scalar_one() >= 10
        for seq, live in samples.items():
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert rebuilt.map.counts() == live, seq
            assert rebuilt.unknown_because == []
            assert rebuilt.batches_replayed < 700
        # By time: the vLLM BlockPool's own snapshots, at their batch timestamps.
        ts_of = {b.batch.seq: b.batch.ts for b in batch_log.all_batches(conn, sid)}
        for snap in sidecar["snapshots"]:
            if snap["pending_events"]:
                continue
            at = ts_of[snap["published_through_seq"]]
            rebuilt = rebuild(conn, position_at_time(conn, sid, at), STREAM)
            assert rebuilt.map.counts() == {(h, g): n for h, g, n in snap["hashes"]}


def test_each_reset_keeps_its_before_and_recovery(store_url: str) -> None:
    _, _, sidecar = ingest_capture(store_url, "lab_10rps_300s", StoreSettings())
    by_label = {s["label"]: s for s in sidecar["snapshots"]}
    expected = [r for r in sidecar["resets"] if r["result"]]
    engine = open_store(store_url)
    with engine.connect() as conn:
        rows = conn.execute(select(schema.resets).order_by(schema.resets.c.seq)).all()
        assert [r.seq for r in rows] == [r["cleared_in_seq"] for r in expected]
        for row, reset in zip(rows, expected, strict=True):
            pre = by_label[next(x for x in reset["snapshots"] if x.endswith("-pre"))]
            tables, _ = decode_tables(row.before)
            before = {(h, k.group): n for k, t in tables.items() for h, n in t.counts().items()}
            assert before == {(h, g): n for h, g, n in pre["hashes"]}
            assert row.before_blocks == len(pre["hashes"]) and row.reason == "all_blocks_cleared"
            assert row.t50_s is not None and 0 < row.t50_s <= (row.t90_s or 1e9)
            points = conn.execute(
                select(schema.reset_recovery)
                .where(schema.reset_recovery.c.reset_id == row.id)
                .order_by(schema.reset_recovery.c.offset_s)
            ).all()
            offsets = [p.offset_s for p in points]
            assert offsets[:4] == [1.0, 2.0, 5.0, 10.0]
            # Shares go up and down (returning blocks get evicted again), but the shared system
            # prompts (a few % of the blocks: suffixes are random) come back within seconds.
            shares = [p.share_blocks_back for p in points]
            assert all(0 <= s <= 1 for s in shares) and max(shares) > 0
            assert points[3].share_tokens_back > 0.02  # ~4 prompts x ~11 blocks of ~990
        rollups = conn.execute(
            select(func.count(), func.sum(schema.rollups.c.clears)).select_from(schema.rollups)
        ).one()
        assert rollups[0] > 250 and rollups[1] == len(expected)
