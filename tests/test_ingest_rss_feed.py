"""benchmarks/_ingest_rss.py's store-on figure is taken with the writer keeping up: the feed
waits for the writer after each take's worth of the stream at an H200's rate, so what the
writer holds unwritten stays a take's worth; without `keep_up` the whole run is queued first."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _ingest_rss import _stores, _token_pool, feed_store
from _ingest_stream import H200_BLOCK_EVENTS_PER_S

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

BLOCKS = 12_000


def _fed(tmp_path: Path, keep_up: bool) -> tuple[list[int], int]:
    rng = random.Random(3)
    settings = StoreSettings(queue_rows=1_000_000, linger_s=3600.0)
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 'feed.sqlite'}"), settings)
    ingest = StreamIngest(StreamId("feed", 0), can_replay=False, sink=writer)
    try:
        waits = feed_store(ingest, writer, _stores(BLOCKS, 3, rng, _token_pool(rng)), keep_up)
        assert writer.flush(60)
        return waits, writer.stats.transactions
    finally:
        writer.close(60)


def test_keeping_up_waits_for_the_writer_after_each_take_of_the_stream(tmp_path: Path) -> None:
    waits, transactions = _fed(tmp_path, keep_up=True)
    per_take = H200_BLOCK_EVENTS_PER_S * StoreSettings().linger_s
    assert len(waits) == BLOCKS // per_take or len(waits) == BLOCKS // per_take - 1
    assert all(0 < b - a <= per_take + 32 for a, b in zip([0, *waits], waits, strict=False))
    # (a linger of an hour: each of these transactions is a wait's flush, not the writer's clock)
    assert transactions >= len(waits) + 1


def test_a_backlog_queues_the_whole_run_before_the_writer_catches_up(tmp_path: Path) -> None:
    waits, transactions = _fed(tmp_path, keep_up=False)
    assert waits == []
    assert transactions < 4
