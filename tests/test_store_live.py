"""Time travel while vLLM's real scheduler streams: every instant recorded live rebuilds from
the store (SQLite and PostgreSQL), hash for hash, by seq and by time."""

from __future__ import annotations

import random
import time
from contextlib import ExitStack

import pytest
from sqlalchemy import select

from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, position_at_time, rebuild, stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.vllm_source import ResetOdds, Source

pytestmark = pytest.mark.vllm
STREAM = StreamId("live", 0)
RESETS = ResetOdds(keep=0.03, preempt=0.02, default=0.02)


def caught_up(collector: Collector, source: Source, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with collector.lock:
            ingest = collector.ingests[STREAM]
            if ingest.last_seq == source.last_seq and not ingest.replaying:
                return
        time.sleep(0.002)
    raise AssertionError(f"collector did not reach seq {source.last_seq}")


def test_instants_recorded_live_rebuild_exactly(store_url: str, stack: ExitStack) -> None:
    port, replay_port = free_port(), free_port()
    source = Source.start(80, port, replay_port, seed=11, resets=RESETS)
    stack.callback(source.close)
    writer = StoreWriter(open_store(store_url), StoreSettings(checkpoint_every_batches=150))
    collector = Collector(
        replica_streams("live", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"),
        settings=CollectorSettings(replay_timeout_s=2.0),
        sink=writer,
    )
    collector.start()
    rng = random.Random(3)
    recorded: dict[int, tuple[float, dict[tuple[int, int], int]]] = {}
    try:
        for _ in range(600):
            source.step()
            if source.last_seq is not None and rng.random() < 0.08:
                caught_up(collector, source)
                with collector.lock:
                    ingest = collector.ingests[STREAM]
                    assert ingest.map.counts() == source.truth_counts()
                    assert ingest.map.counters.last_ts is not None
                    recorded[source.last_seq] = (ingest.map.counters.last_ts, ingest.map.counts())
    finally:
        collector.stop()
        writer.close()
    assert len(recorded) > 25

    with writer.engine.connect() as conn:
        sid = stream_id(conn, "live")
        for seq, (ts, live) in recorded.items():
            by_seq = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert by_seq.map.counts() == live, seq
            by_time = rebuild(conn, position_at_time(conn, sid, ts), STREAM)
            assert by_time.map.counts() == live, (seq, ts)
            assert by_seq.unknown_because == []
        stretches = conn.execute(
            select(schema.intervals).where(schema.intervals.c.kind == "connected")
        ).all()
        assert len(stretches) == 1 and stretches[0].to_ts is not None
        assert stretches[0].to_ts > stretches[0].from_ts
