"""Retention prunes by age and never what the retained window needs to rebuild."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, event, func, insert, select

from kvscope.collector.snapshot import encode_map
from kvscope.storage import batch_log, log_known_sql, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import (
    NotInStore,
    position_at_seq,
    position_at_time,
    rebuild,
    stream_id,
)
from kvscope.storage.log_chunks import known_name_of
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


NAMING = StoreSettings(checkpoint_every_batches=700, rows_per_transaction=300, log_chunk_format=6)
"""Chunks of format 6, which name the checkpoint before them."""


@pytest.mark.parametrize("delta_share", [0.0, 1e9], ids=["whole", "deltas"])
def test_a_checkpoint_a_kept_chunk_names_is_kept(store_url: str, delta_share: float) -> None:
    """Log chunk format 6 reads its hash literals through the checkpoint it names. Retention
    keeps the newest checkpoint before its cutoff and the log after it; a chunk reaching past
    that anchor stays whole, and so must the checkpoint it names (and a delta's key), older than
    the anchor though it is. The writer cuts chunks at its checkpoints, so it never stores such
    a chunk: a checkpoint of the true map is added in the middle of one (as another might),
    and the stream cut after it."""
    settings = dataclasses.replace(NAMING, checkpoint_delta_share=delta_share)
    _, samples, _ = ingest_capture(store_url, "lab_10rps_300s", settings, 50)
    engine = open_store(store_url)
    b, c = schema.log_chunks, schema.checkpoints
    with engine.begin() as conn:
        sid = stream_id(conn, STREAM.replica)
        spans = {
            first: (name, last)
            for first, last, data in conn.execute(select(b.c.first_seq, b.c.last_seq, b.c.data))
            if (name := known_name_of(bytes(data))) is not None and last - first >= 2
        }
        first = sorted(spans)[len(spans) // 2]
        (_, named_seq, _), last = spans[first]
        truth = {
            seq: rebuild(conn, position_at_seq(conn, sid, seq), STREAM).map.counts()
            for seq in (first + 1, (first + last) // 2, last)
        }
        anchor = rebuild(conn, position_at_seq(conn, sid, first), STREAM).map
        cutoff = position_at_seq(conn, sid, first).ts
        conn.execute(
            insert(c).values(
                stream_id=sid,
                epoch=0,
                seq=first,
                ts=cutoff,
                blocks=sum(anchor.counts().values()),
                snapshot=encode_map(anchor),
            )
        )
        # The stream ends with that chunk: no delta past the anchor keeps the named one's key.
        conn.execute(delete(b).where(b.c.first_seq > last))
        conn.execute(delete(c).where(c.c.seq > first))
        last_ts = conn.execute(select(func.max(b.c.max_ts))).scalar_one()
        key = conn.execute(select(c.c.key_seq).where(c.c.seq == named_seq)).scalar_one()
        assert (key is not None) == (delta_share > 0)
    truth |= {seq: counts for seq, counts in samples.items() if first <= seq <= last}

    retention = Retention(log_s=last_ts - cutoff, checkpoints_s=None, rollups_s=None)
    assert prune(engine, retention, last_ts).batches > 0
    log_known_sql._kept.clear()  # as a process started since would find it
    with engine.connect() as conn:
        assert first in conn.execute(select(b.c.first_seq)).scalars().all()  # kept whole
        for seq, counts in sorted(truth.items()):
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert rebuilt.map.counts() == counts, seq  # counts by hash: hash for hash
        # Before the window: unknown, or exact; never wrong.
        for seq, counts in samples.items():
            if seq < first:  # (those past `last` are no longer stored)
                try:
                    rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
                except NotInStore:
                    continue
                assert rebuilt.map.counts() == counts, seq
    again = prune(engine, retention, last_ts)
    assert (again.batches, again.checkpoints) == (0, 0)

    # Once a checkpoint after the chunk is the anchor, the chunk goes, and with it what it named.
    with engine.begin() as conn:
        at_last = rebuild(conn, position_at_seq(conn, sid, last), STREAM).map
        conn.execute(
            insert(c).values(
                stream_id=sid,
                epoch=0,
                seq=last,
                ts=position_at_seq(conn, sid, last).ts,
                blocks=sum(at_last.counts().values()),
                snapshot=encode_map(at_last),
            )
        )
    gone = prune(engine, Retention(log_s=0.5, checkpoints_s=None, rollups_s=None), last_ts + 1)
    assert gone.batches > 0 and gone.checkpoints > 0
    log_known_sql._kept.clear()
    with engine.connect() as conn:
        assert conn.execute(select(b.c.first_seq)).scalars().all() == []
        left = set(conn.execute(select(c.c.seq)).scalars())
        assert last in left and named_seq not in left and (key is None or key not in left)
    engine.dispose()


def test_a_prune_reads_no_chunk_or_checkpoint_bytes(store_url: str) -> None:
    """What retention needs of a chunk or a checkpoint (what it names) lies in its columns:
    reading every chunk's and checkpoint's bytes at every prune (a week of them per stream)
    would hold SQLite's write lock for seconds (its substr reads a whole blob)."""
    _, _, _ = ingest_capture(store_url, "lab_10rps_300s", NAMING)
    engine = open_store(store_url)
    with engine.connect() as conn:
        last_ts = conn.execute(select(func.max(schema.log_chunks.c.max_ts))).scalar_one()
    statements: list[str] = []

    def record(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    pruned = prune(engine, Retention(log_s=60.0, checkpoints_s=None, rollups_s=None), last_ts)
    event.remove(engine, "before_cursor_execute", record)
    assert pruned.batches > 0 and pruned.checkpoints > 0
    reads = [
        s
        for s in statements
        if any(read in s.lower() for read in ("log_chunks.data", "rowid", "checkpoints.snapshot"))
    ]
    assert reads == []
    engine.dispose()


def _synthetic_store(url: str, chunks: int) -> Engine:
    """One stream, one epoch of `chunks` small chunks of 10 batches; a checkpoint every 200
    chunks (one in 10 a key, the others deltas of it), which the chunks after it name."""
    engine = open_store(url)
    with engine.begin() as conn:
        sid = conn.execute(
            insert(schema.streams).values(replica="r", rank=0).returning(schema.streams.c.id)
        ).scalar_one()
        checkpoints: list[dict[str, object]] = []
        rows: list[dict[str, object]] = []
        key = 0
        for i in range(chunks):
            if i % 200 == 0:
                key = i * 10 if i % 2000 == 0 else key
                delta = None if key == i * 10 else key
                checkpoints.append(
                    dict(stream_id=sid, epoch=0, seq=i * 10, ts=float(i), blocks=1,
                         snapshot=b"x", key_seq=delta)
                )  # fmt: skip
            named = checkpoints[-1]["seq"] if i % 200 else None
            rows.append(
                dict(stream_id=sid, epoch=0, first_seq=i * 10 + 1, last_seq=i * 10 + 10,
                     min_ts=float(i), max_ts=i + 0.9, batches=10, raw_bytes=1, data=b"y",
                     min_recv_ts=float(i), max_recv_ts=i + 0.9, known_seq=named)
            )  # fmt: skip
        conn.execute(insert(schema.log_chunks), rows)
        conn.execute(insert(schema.checkpoints), checkpoints)
    return engine


def _prune_steps(url: str, chunks: int) -> int:
    """SQLite virtual machine steps (in thousands) of a prune that deletes all but the last
    tenth of the synthetic store."""
    engine = _synthetic_store(url, chunks)
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    with engine.connect() as conn:
        conn.connection.dbapi_connection.set_progress_handler(step, 1000)  # type: ignore[union-attr]
    retention = Retention(log_s=chunks / 10, checkpoints_s=None, rollups_s=None)
    pruned = prune(engine, retention, float(chunks))
    assert pruned.checkpoints > chunks / 400
    engine.dispose()
    return steps[0]


def test_a_prune_reads_each_chunk_a_bounded_number_of_times(tmp_path: Path) -> None:
    """Which checkpoints chunks name is found once per statement, not once per checkpoint
    deleted: that walked every chunk of the epoch for each (seconds, under SQLite's write lock,
    for a day's checkpoints of a week of log). Counted in SQLite's VM steps, not timed: ten
    times the chunks (and the checkpoints to delete) must take about ten times the steps."""
    small = _prune_steps(f"sqlite:///{tmp_path / 'small.sqlite'}", 4_000)
    large = _prune_steps(f"sqlite:///{tmp_path / 'large.sqlite'}", 40_000)
    assert large < 20 * small, (small, large)
