"""The writer thread's time, reported beside its wall time in transactions (`WriterStats`): its
CPU seconds, so that benchmarks/store.py can say whether the writer or the ingest thread bounds
the store's share of ingest. Read once per transaction, not per row."""

from __future__ import annotations

import time
from pathlib import Path

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import frames, payload, store

STREAM = StreamId("timed", 0)


def test_the_writer_thread_s_cpu_seconds_are_counted_per_transaction(tmp_path: Path) -> None:
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 'store.sqlite'}"))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for seq in range(200):
        ingest.live_frames(frames(seq, payload(store(2 * seq + 1, 2 * seq + 2))), time.time())
    writer.close(30)
    stats = writer.stats
    assert stats.transactions > 0 and stats.rows_written > 0
    assert stats.writer_cpu_seconds_total > 0
