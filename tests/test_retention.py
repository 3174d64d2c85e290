"""Retention prunes by age and never what the retained window needs to rebuild."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import NotInStore, position_at_time, rebuild, stream_id
from kvscope.storage.retention import Retention, prune
from kvscope.storage.store_settings import StoreSettings
from tests.test_store import STREAM, ingest_capture


def count(conn: object, table: object) -> int:
    return int(conn.execute(select(func.count()).select_from(table)).scalar())  # type: ignore[attr-defined,arg-type]


def test_every_instant_inside_the_window_still_rebuilds(store_url: str) -> None:
    settings = StoreSettings(checkpoint_every_batches=400)
    _, samples, _ = ingest_capture(store_url, "lab_10rps_300s", settings, 40)
    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, "lab")
        ts_of = {b.batch.seq: b.batch.ts for b in batch_log.all_batches(conn, sid)}
        batches_before = batch_log.count_batches(conn)
        resets_before = count(conn, schema.resets)
    last_ts = max(ts_of.values())
    first_ts = min(ts_of.values())
    cutoff = first_ts + (last_ts - first_ts) / 2

    pruned = prune(
        engine, Retention(log_s=last_ts - cutoff, checkpoints_s=None, rollups_s=100.0), last_ts
    )
    assert pruned.batches > 0.3 * batches_before and pruned.rollups > 100

    with engine.connect() as conn:
        assert count(conn, schema.resets) == resets_before  # resets are kept
        kept = [seq for seq in samples if ts_of[seq] >= cutoff]
        assert len(kept) > 20
        for seq in kept:
            rebuilt = rebuild(conn, position_at_time(conn, sid, ts_of[seq]), STREAM)
            assert rebuilt.map.counts() == samples[seq], seq
        oldest = min(ts_of.values())
        with pytest.raises(NotInStore, match="log starts at"):
            position_at_time(conn, sid, oldest)
        oldest_second = conn.execute(select(func.min(schema.rollups.c.second))).scalar_one()
        assert oldest_second >= last_ts - 101

    # Pruning again changes nothing: what is left is what the window needs.
    again = prune(
        engine, Retention(log_s=last_ts - cutoff, checkpoints_s=None, rollups_s=100.0), last_ts
    )
    assert (again.batches, again.checkpoints) == (0, 0)


def test_pruned_resets_take_their_recovery_and_prefix_groups_along(store_url: str) -> None:
    """`--reset-days`: a reset goes with every row that names it (PostgreSQL refuses to delete
    a reset that its prefix groups still name)."""
    ingest_capture(store_url, "lab_3rps_180s", StoreSettings(checkpoint_every_batches=400), 40)
    engine = open_store(store_url)
    with engine.connect() as conn:
        assert count(conn, schema.reset_prefix_groups) > 0
        newest = conn.execute(select(func.max(schema.resets.c.ts))).scalar_one()
    pruned = prune(engine, Retention(None, None, None, resets_s=0.0), newest + 1.0)
    assert pruned.resets > 0
    with engine.connect() as conn:
        for table in (schema.resets, schema.reset_recovery, schema.reset_prefix_groups):
            assert count(conn, table) == 0, table.name
    engine.dispose()
