"""Checkpoints are paced by what they cost on disk beside the log: on a real SQLite file and the
real PostgreSQL, the checkpoints before the last take at most 1/ratio of the log's bytes."""

from __future__ import annotations

from sqlalchemy import func, select

from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from tests.test_store import ingest_capture


def test_checkpoints_are_a_bounded_share_of_the_log_on_disk(store_url: str) -> None:
    ratio = 2.0
    settings = StoreSettings(checkpoint_log_ratio=ratio, checkpoint_every_batches=10**9)
    writer, _, _ = ingest_capture(store_url, "lab_10rps_300s", settings)
    assert writer.stats.batches_dropped == 0
    c, b = schema.checkpoints, schema.log_chunks
    with open_store(store_url).connect() as conn:
        sizes = conn.execute(select(func.length(c.c.snapshot)).order_by(c.c.seq)).scalars().all()
        log = conn.execute(select(func.sum(func.length(b.c.data)))).scalar_one()
    assert len(sizes) >= 3
    assert sum(sizes[:-1]) <= log / ratio
