"""The store's queue is bounded in bytes, not only in rows: a publisher's large batches (up to
the message limit each) or a reset's map snapshot cannot make it hold gigabytes in memory."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.spill import Spill
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)

ROW = 1_000


def _drain(queue: RowQueue[tuple[str, int]], expect: int) -> list[tuple[str, int]]:
    taken: list[tuple[str, int]] = []
    while len(taken) < expect:
        rows = queue.take(64)
        assert rows is not None
        taken.extend(rows)
        queue.done(sum(1 for kind, _ in rows if kind == "batch"))
    return taken


def test_droppable_rows_past_the_byte_bound_are_refused_without_a_spill() -> None:
    queue: RowQueue[tuple[str, int]] = RowQueue(1_000, linger_s=0.0, bytes_limit=5 * ROW)
    accepted = [i for i in range(20) if queue.put(("batch", i), True, ROW)]
    assert accepted == [0, 1, 2, 3, 4]
    assert queue.memory_bytes == 5 * ROW
    assert _drain(queue, 5) == [("batch", i) for i in range(5)]
    assert queue.memory_bytes == 0
    assert queue.put(("batch", 20), True, ROW)  # room again


@pytest.mark.parametrize("spilled", [False, True], ids=["no spill", "spill"])
def test_put_batch_is_put_of_a_droppable_row(spilled: bool, tmp_path: Path) -> None:
    """The per-batch call takes its shortcut only where `put` would keep the row in memory."""

    def queue() -> RowQueue[tuple[str, int]]:
        spill: Spill[tuple[str, int]] | None = Spill(8 * ROW, str(tmp_path)) if spilled else None
        return RowQueue(12, linger_s=0.0, spill=spill, bytes_limit=9 * ROW)

    rng = random.Random(5)
    plain, fast = queue(), queue()
    said: dict[int, list[tuple[bool, object, int, int, int]]] = {0: [], 1: []}
    for i in range(600):
        size = rng.choice((0, ROW // 2, ROW, 3 * ROW, 12 * ROW))
        rare = rng.random() < 0.1
        take = rng.randint(1, 8) if rng.random() < 0.1 else 0
        for k, q in enumerate((plain, fast)):
            if rare:
                q.put(("rare", i), False, size)
                result = True
            else:
                result = (
                    q.put(("batch", i), True, size) if k == 0 else q.put_batch(("batch", i), size)
                )
            taken = q.take(take) if take and q.pending else None
            if taken is not None:
                q.done(sum(1 for kind, _ in taken if kind == "batch"))
            said[k].append((result, taken, q.memory_bytes, q.pending, q.put_total))
    assert said[0] == said[1]
    assert any(result is False for result, *_ in said[0])  # past the bounds (and the spill)


def test_droppable_rows_past_the_byte_bound_spill_and_come_back_in_order(tmp_path: Path) -> None:
    spill: Spill[tuple[str, int]] = Spill(1 << 20, str(tmp_path))
    queue: RowQueue[tuple[str, int]] = RowQueue(
        1_000, linger_s=0.0, spill=spill, bytes_limit=5 * ROW
    )
    assert all(queue.put(("batch", i), True, ROW) for i in range(50))
    assert queue.memory_bytes == 5 * ROW and len(spill) == 45
    assert _drain(queue, 50) == [("batch", i) for i in range(50)]


def test_rare_rows_past_their_bound_wait_on_disk_even_past_the_spills_cap(tmp_path: Path) -> None:
    """A reset is never dropped; past `rare_bytes_limit` in memory it waits in the spill file,
    whose cap is for what may be dropped."""
    spill: Spill[tuple[str, int]] = Spill(2 * ROW, str(tmp_path))
    queue: RowQueue[tuple[str, int]] = RowQueue(
        1_000, linger_s=0.0, spill=spill, bytes_limit=5 * ROW, rare_bytes_limit=3 * ROW
    )
    for i in range(10):
        queue.put(("reset", i), False, ROW)
    assert queue.memory_bytes == 3 * ROW and len(spill) == 7
    assert queue.pending == 10
    assert _drain(queue, 10) == [("reset", i) for i in range(10)]
    assert queue.memory_bytes == 0 and not spill.active


def test_rare_rows_keep_their_order_while_one_waits_on_disk(tmp_path: Path) -> None:
    """A recovery row names its reset: once a reset waits in the spill, the rare rows after it
    wait there too, even when memory has room again. (benchmarks/outage.py found recoveries
    refused for a reset not yet stored: the later row had gone ahead through memory.)"""
    spill: Spill[tuple[str, int]] = Spill(2 * ROW, str(tmp_path))
    queue: RowQueue[tuple[str, int]] = RowQueue(
        1_000, linger_s=0.0, spill=spill, bytes_limit=5 * ROW, rare_bytes_limit=3 * ROW
    )
    for i in range(4):  # the fourth is past the bound: on disk
        queue.put(("reset", i), False, ROW)
    assert len(spill) == 1
    rows = queue.take(3)  # the writer takes what memory holds (not the spill: a take is bounded)
    assert rows == [("reset", i) for i in range(3)]
    queue.done(0)
    assert queue.memory_bytes == 0
    queue.put(("recovery", 3), False, ROW)  # memory has room, but reset 3 is still on disk
    assert _drain(queue, 2) == [("reset", 3), ("recovery", 3)]


def test_the_spill_hands_back_a_bounded_number_of_bytes_at_a_time(tmp_path: Path) -> None:
    spill: Spill[bytes] = Spill(1 << 24, str(tmp_path))
    for _ in range(100):
        assert spill.put(bytes(10_000))
    first = spill.take(1_000, max_bytes=50_000)
    assert 4 <= len(first) <= 6
    assert spill.take(1, max_bytes=1) == [bytes(10_000)]  # at least one row, whatever its size
    rest = []
    while batch := spill.take(1_000, max_bytes=50_000):
        rest.append(batch)
    assert len(first) + 1 + sum(map(len, rest)) == 100


def _store_gauges(writer: StoreWriter) -> dict[str, float]:
    """The store's own samples from /metrics (read without the store: it is locked)."""
    client = TestClient(create_app(ApiData(engine=writer.engine, writer=writer), ApiSettings()))
    text = client.get("/metrics").text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("kvscope_store_")
    }


def test_the_writer_counts_payload_and_map_bytes_against_the_bounds(tmp_path: Path) -> None:
    """StoreWriter hands each row's size to the queue. While the store cannot be written (a
    real SQLite file locked by another connection, which the writer waits out), 5.7 MB of
    payloads arrive: memory stays within the byte bounds plus one row (a map snapshot of this
    recording is well under 1 MiB), the resets wait in the spill past its tiny cap, and once
    the store answers every reset is there and the hole is said."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    bound = 256 << 10
    settings = StoreSettings(
        queue_rows=1_000_000,
        queue_bytes=bound,
        rare_bytes=bound,
        spill_bytes=4096,
        spill_dir=str(tmp_path),
        retry_initial_s=0.01,
        retry_max_s=0.05,
        linger_s=0,
    )
    writer = StoreWriter(open_store(url), settings)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    records = list(read_capture(capture_path("lab_10rps_300s.msgpack.gz")))
    assert sum(len(r.frames[-1]) for r in records) > 20 * bound
    lock = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        held = 0
        for record in records:
            ingest.live_frames(record.frames, record.recv_ts)
            held = max(held, writer.memory_bytes)
        assert held <= 2 * bound + (1 << 20)
        assert writer.stats.batches_dropped > len(records) // 2
        assert writer.rare_spilled_total > 0
        exported = _store_gauges(writer)
        assert exported["kvscope_store_queue_bytes"] == writer.memory_bytes > 0
        assert exported["kvscope_store_rare_spilled_rows_total"] == writer.rare_spilled_total
    finally:
        lock.rollback()
        lock.close()
    writer.close(60)
    with open_store(url).connect() as conn:
        kinds = conn.execute(select(schema.intervals.c.kind)).scalars().all()
        resets = conn.execute(select(schema.resets.c.seq)).scalars().all()
    assert "incomplete" in kinds
    sidecar = json.loads(capture_path("lab_10rps_300s.json").read_text())
    assert sorted(resets) == [r["cleared_in_seq"] for r in sidecar["resets"] if r["result"]]
