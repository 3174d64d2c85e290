"""Log chunk format 6 in a store (storage/log_known.py): chunks name the checkpoint before them,
every instant still rebuilds hash for hash, and a chunk whose checkpoint is gone is refused,
never read wrong."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, FanOut, NullSink
from kvscope.storage import batch_log, log_known_sql, schema
from kvscope.storage.engine import open_store, upgrade
from kvscope.storage.history import (
    NotInStore,
    position_at_seq,
    position_at_time,
    rebuild,
    stream_id,
)
from kvscope.storage.log_chunks import ChunkError, known_name_of
from kvscope.storage.log_columns import FORMAT_6_MAGIC
from kvscope.storage.log_rewrite import rewrite_chunk
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.migration_support import column_down_and_up, downgrade
from tests.test_store import STREAM

SETTINGS = StoreSettings(checkpoint_every_batches=700, rows_per_transaction=300, log_chunk_format=6)


def hashes_of(prefix_map: Any) -> dict[Any, frozenset[int]]:
    return {key: table.hashes() for key, table in prefix_map.tables.items()}


def stored_with_samples(store_url: str) -> dict[int, tuple[Any, Any]]:
    writer = StoreWriter(open_store(store_url), SETTINGS)
    samples: dict[int, tuple[Any, Any]] = {}
    rng = random.Random(11)

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if rng.randrange(50) == 0:
                samples[batch.seq] = (ingest.map.counts(), hashes_of(ingest.map))

    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(writer, Sample()))
    for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    assert writer.stats.batches_dropped == 0 and len(samples) > 80
    return samples


def chunks(conn: sa.Connection) -> list[tuple[int, int, bytes]]:
    c = schema.log_chunks
    rows = conn.execute(sa.select(c.c.epoch, c.c.first_seq, c.c.data).order_by(c.c.first_seq))
    return [(epoch, first, bytes(data)) for epoch, first, data in rows]


def test_every_instant_rebuilds_hash_for_hash_through_checkpoint_hashes(store_url: str) -> None:
    samples = stored_with_samples(store_url)
    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        stored = chunks(conn)
        named = [known_name_of(data) for _, _, data in stored]
        assert sum(n is not None for n in named) > 0.5 * len(stored)
        checkpoints = conn.execute(sa.select(schema.checkpoints.c.seq)).scalars().all()
        for (_, first, _), name in zip(stored, named, strict=True):
            if name is not None:
                # The newest checkpoint before the chunk, of its epoch.
                assert name[1] == max(s for s in checkpoints if s < first)
        for seq, (counts, hashes) in samples.items():
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert rebuilt.map.counts() == counts, seq
            assert hashes_of(rebuilt.map) == hashes, seq
        # Each batch read alone, as `kvscope dump --seq` does.
        for seq in list(samples)[:10]:
            found = batch_log.batch_at(conn, sid, 0, seq)
            assert found is not None and found.seq == seq
    engine.dispose()


def named_checkpoint_deleted(store_url: str, middle: bool) -> tuple[sa.Engine, int, int]:
    """A stored stream with the checkpoint deleted that its first (or `middle`) chunk naming
    one names: the engine, the stream's id and that chunk's first seq."""
    stored_with_samples(store_url)
    engine = open_store(store_url)
    with engine.begin() as conn:
        sid = stream_id(conn, STREAM.replica)
        named = [(f, n) for _, f, d in chunks(conn) if (n := known_name_of(d)) is not None]
        first, name = named[len(named) // 2 if middle else 0]
        k = schema.checkpoints
        conn.execute(sa.delete(k).where(k.c.stream_id == sid, k.c.seq == name[1]))
    # As a process started since would find it: an earlier test's store of the same capture may
    # have left the same checkpoint's hashes (same stream id, seq and digest) in the cache.
    log_known_sql._kept.clear()
    return engine, sid, first


def test_a_chunk_whose_checkpoint_is_gone_is_refused(store_url: str) -> None:
    engine, sid, first = named_checkpoint_deleted(store_url, middle=False)
    with engine.connect() as conn, pytest.raises(ChunkError, match="not stored"):
        batch_log.batch_at(conn, sid, 0, first)
    engine.dispose()


def test_0019_down_rewrites_format_6_chunks_in_format_5_and_up_again(store_url: str) -> None:
    stored_with_samples(store_url)
    engine = open_store(store_url)

    def stored() -> tuple[set[bytes], list[tuple[Any, ...]]]:
        with engine.connect() as conn:
            sid = stream_id(conn, STREAM.replica)
            batches = [tuple(b.batch) for b in batch_log.all_batches(conn, sid)]
            return {data[:4] for _, _, data in chunks(conn)}, batches

    magics, before = stored()
    assert FORMAT_6_MAGIC in magics and len(before) == 7724
    downgrade(engine, "0018")
    magics, down = stored()
    assert FORMAT_6_MAGIC not in magics and down == before
    upgrade(engine)
    assert stored()[1] == before
    engine.dispose()


def stored_names(engine: sa.Engine) -> list[tuple[int | None, int | None]]:
    """Each chunk's `known_seq` column beside the seq its header names (None: names none)."""
    c = schema.log_chunks
    with engine.connect() as conn:
        rows = conn.execute(sa.select(c.c.known_seq, c.c.data).order_by(c.c.first_seq))
        return [
            (known, None if (name := known_name_of(bytes(data))) is None else name[1])
            for known, data in rows
        ]


def test_each_chunk_names_its_checkpoint_in_a_column(store_url: str) -> None:
    """Retention keeps the checkpoints kept chunks name: it reads the names from a column, not
    from every chunk's bytes at every prune."""
    stored_with_samples(store_url)
    engine = open_store(store_url)
    names = stored_names(engine)
    assert sum(header is not None for _, header in names) > 0.5 * len(names)
    assert all(column == header for column, header in names)
    engine.dispose()


def test_0020_up_fills_the_name_column_from_the_chunks_and_down_drops_it(store_url: str) -> None:
    stored_with_samples(store_url)
    engine = open_store(store_url)
    column_down_and_up(engine, "0019", "log_chunks", "known_seq", stored_names)
    engine.dispose()


def test_a_chunk_packed_again_keeps_its_checkpoint_hashes(store_url: str) -> None:
    """As the writer packs a stream's first chunks again against its first dictionary."""
    stored_with_samples(store_url)
    engine = open_store(store_url)
    with engine.begin() as conn:
        sid = stream_id(conn, STREAM.replica)
        epoch, first, data = next(c for c in chunks(conn) if known_name_of(c[2]) is not None)
        before = [tuple(b) for b in batch_log.batches_between(conn, sid, epoch, first - 1, 10**9)]
        table = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
        assert rewrite_chunk(conn, table, (sid, epoch, first), 6, None)
        again = next(c[2] for c in chunks(conn) if c[1] == first)
        assert known_name_of(again) == known_name_of(data)
        after = [tuple(b) for b in batch_log.batches_between(conn, sid, epoch, first - 1, 10**9)]
        assert after == before
    engine.dispose()


def test_a_rebuild_past_a_deleted_named_checkpoint_is_unknown(tmp_path: Path) -> None:
    # As past a deleted dictionary (tests/test_log_chunk_damage.py): NotInStore, the API's 404
    # `not_in_store`, and a reset follower's "unknown", not a failed transaction or a 500.
    engine, sid, first = named_checkpoint_deleted(f"sqlite:///{tmp_path / 's.sqlite'}", middle=True)
    with engine.connect() as conn, pytest.raises(NotInStore, match="not stored"):
        rebuild(conn, position_at_seq(conn, sid, first + 1), STREAM)
    engine.dispose()


def test_finding_a_position_reads_stamps_not_the_named_checkpoint(tmp_path: Path) -> None:
    # A position (by seq or by time) needs a batch's stamps alone: reading its payload would
    # decode the checkpoint its chunk names first, and the rebuild after would decode it again.
    engine, sid, first = named_checkpoint_deleted(f"sqlite:///{tmp_path / 's.sqlite'}", middle=True)
    with engine.connect() as conn:
        position = position_at_seq(conn, sid, first + 1)
        assert position.seq == first + 1
        assert position_at_time(conn, sid, position.ts).ts == position.ts
    engine.dispose()
