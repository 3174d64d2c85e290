"""Log dictionaries in a real store (SQLite file and PostgreSQL): written with the chunks that
name them, even when a transaction fails; kept by retention while a chunk names them; and
migration 0013, up and back down to format 1 chunks."""

from __future__ import annotations

import random

import msgspec
import pytest
import sqlalchemy as sa

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, FanOut, NullSink
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, position_at_time, rebuild, stream_id
from kvscope.storage.log_chunks import CHUNK_FORMAT, FORMAT_2_MAGIC, SETTABLE_FORMATS
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.retention import Retention, prune
from kvscope.storage.rows import LogRow
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.migration_support import log_down_and_up, stored_dictionaries, write
from tests.test_log_dictionary import block_log, token_pool
from tests.test_store import STREAM


def row_writer(cap: int = 1 << 20, fmt: int = CHUNK_FORMAT) -> RowWriter:
    packer = LogPacker(cap, ratio=0.5, fmt=fmt)
    return RowWriter(None, packer=packer)


def phased_log(rng: random.Random, phases: int, per_phase: int) -> list[LogRow]:
    """Content that changes by phase (a new set of prompts), seqs and times running on."""
    rows: list[LogRow] = []
    for _ in range(phases):
        for row in block_log(rng, per_phase, token_pool(rng, 40)):
            seq = len(rows)
            rows.append((row[0], 0, seq, 1000.0 + seq / 100, 1000.0 + seq / 100, row[5]))
    return rows


@pytest.mark.parametrize("fmt", SETTABLE_FORMATS)
def test_chunks_name_stored_dictionaries_even_past_a_failed_transaction(
    store_url: str, fmt: int
) -> None:
    engine = open_store(store_url)
    rows = block_log(random.Random(4), 500, token_pool(random.Random(4), 40))
    writer = row_writer(fmt=fmt)
    write(engine, writer, rows[:100])
    write(engine, writer, rows[100:200], lost=True)  # it carried the first dictionary
    for start in range(200, 500, 100):
        write(engine, writer, rows[start : start + 100])
    with engine.connect() as conn:
        have, named = stored_dictionaries(conn)
        assert named and named <= have
        sid = conn.execute(sa.select(schema.streams.c.id)).scalar_one()
        got = [(b.batch.seq, b.batch.payload) for b in batch_log.all_batches(conn, sid)]
        assert got == [(r[2], r[5]) for r in rows[:100] + rows[200:]]
    engine.dispose()


def test_retention_keeps_the_dictionaries_kept_chunks_name_and_the_newest(store_url: str) -> None:
    engine = open_store(store_url)
    rows = phased_log(random.Random(9), 6, 300)
    writer = row_writer(cap=3000)  # a phase's content pushes the last one out
    for start in range(0, len(rows), 100):
        write(engine, writer, rows[start : start + 100])
    with engine.begin() as conn:
        sid = conn.execute(sa.select(schema.streams.c.id)).scalar_one()
        conn.execute(
            sa.insert(schema.checkpoints).values(
                stream_id=sid, epoch=0, seq=1099, ts=rows[1099][3], blocks=0, snapshot=b"x"
            )
        )
        have_before, named_before = stored_dictionaries(conn)
    assert len(named_before) >= 4
    cutoff = rows[1150][3]
    pruned = prune(engine, Retention(log_s=100.0, checkpoints_s=None, rollups_s=None), cutoff + 100)
    assert pruned.batches == 1100
    with engine.connect() as conn:
        have, named = stored_dictionaries(conn)
        d = schema.log_dictionaries
        newest = sa.select(d.c.digest).order_by(d.c.made_at.desc()).limit(1)
        assert have == named | {bytes(conn.execute(newest).scalar_one())}
        assert pruned.dictionaries == len(have_before - have) > 0
        got = [b.batch.payload for b in batch_log.all_batches(conn, sid)]
        assert got == [r[5] for r in rows[1100:]]
    # The stream went quiet past the window: its whole log goes, but for its newest dictionary,
    # which its writer may still name in chunks to come, trusting it stored.
    last = rows[-1]
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.checkpoints).values(
                stream_id=sid, epoch=0, seq=last[2], ts=last[3], blocks=0, snapshot=b"x"
            )
        )
    pruned = prune(
        engine, Retention(log_s=100.0, checkpoints_s=None, rollups_s=None), last[3] + 101
    )
    assert pruned.batches == len(rows) - 1100
    with engine.connect() as conn:
        assert stored_dictionaries(conn) == ({bytes(conn.execute(newest).scalar_one())}, set())
    engine.dispose()


def test_0013_down_rewrites_format_2_chunks_in_format_1_and_up_again(store_url: str) -> None:
    # What a kvscope at 0013 writes: format 2.
    log_down_and_up(store_url, "0013", 2, {FORMAT_2_MAGIC}, {None}, dictionaries_go=True)


def retokened(frames: list[bytes], pool: list[list[int]]) -> list[bytes]:
    """A recorded batch whose blocks' tokens are drawn from `pool` by hash: the recording's
    prompts hardly recur, a production stream's do (what the dictionaries are for)."""
    ts, events, *rest = msgspec.msgpack.decode(frames[-1])
    for event in events:
        if isinstance(event, dict) and event.get("token_ids"):
            event["token_ids"] = [t for h in event["block_hashes"] for t in pool[h % len(pool)]]
    return [*frames[:-1], msgspec.msgpack.encode([ts, events, *rest])]


@pytest.mark.parametrize("fmt", SETTABLE_FORMATS)
def test_every_instant_rebuilds_through_the_dictionaries(store_url: str, fmt: int) -> None:
    pool = token_pool(random.Random(1), 200)
    settings = StoreSettings(
        checkpoint_every_batches=700,
        rows_per_transaction=300,
        log_dictionary_ratio=0.5,
        log_chunk_format=fmt,
    )
    writer = StoreWriter(open_store(store_url), settings)
    samples: dict[int, dict[tuple[int, int], int]] = {}
    rng = random.Random(7)

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if rng.randrange(60) == 0:
                samples[batch.seq] = ingest.map.counts()

    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(writer, Sample()))
    for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
        ingest.live_frames(retokened(record.frames, pool), record.recv_ts)
    writer.close()
    assert writer.stats.batches_dropped == 0 and len(samples) > 50
    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        c = schema.log_chunks
        named = conn.execute(sa.select(sa.func.count()).where(c.c.dictionary.is_not(None)))
        assert named.scalar_one() > 0.8 * count_chunks(conn)
        for seq, live in samples.items():
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
            assert rebuilt.map.counts() == live, seq
            # By time: the batch stamped last at its instant (it, or one stamped alike).
            at = position_at_time(conn, sid, rebuilt.position.ts)
            assert at.ts == rebuilt.position.ts and at.seq >= seq
            if at.seq == seq:
                assert rebuild(conn, at, STREAM).map.counts() == live
    engine.dispose()


def count_chunks(conn: sa.Connection) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(schema.log_chunks)).scalar_one())
