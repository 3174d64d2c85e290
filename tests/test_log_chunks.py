"""The chunked batch log: packing is lossless, and every lookup agrees with a plain list.

The lookups run on a real SQLite file and the real PostgreSQL, over logs whose engine clock
jumps back and forth (a stepped clock), where "the batch stamped last before an instant" is
easiest to get wrong.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store, upgrade
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import (
    MAX_CHUNK_BATCHES,
    MAX_CHUNK_RAW_BYTES,
    MAX_CHUNK_SPAN_S,
    Chunk,
    ChunkError,
    split,
)
from kvscope.storage.rows import LogRow
from kvscope.storage.sql_writer import RowWriter
from tests.migration_support import downgrade, engine_at

A, B = StreamId("a", 0), StreamId("b", 0)


def random_log(rng: random.Random, n: int, stream: StreamId = A) -> list[LogRow]:
    """Batches as the ingest applies them: seqs rising with holes, epochs rising, a clock that
    mostly moves forward and sometimes steps back or leaps."""
    rows: list[LogRow] = []
    epoch, seq, ts = 0, 0, 1000.0
    for _ in range(n):
        if rng.random() < 0.01:
            epoch, seq = epoch + 1, 0
        seq += 1 if rng.random() < 0.9 else rng.randint(2, 5)
        step = rng.choice([0.0, 0.01, 0.2, 0.5, -3.0, 12.0]) if rng.random() < 0.2 else 0.05
        ts = round(ts + step, 3)
        payload = rng.randbytes(rng.choice([0, 1, 50, 900, 4000]))
        rows.append((stream, epoch, seq, ts, ts + 0.001, payload))
    return rows


def steady_log(rng: random.Random, n: int) -> list[LogRow]:
    """One stream and epoch, the clock only ahead: what the writer's fast path cuts."""
    # Half spread out (runs end on time or size), half a burst of small batches within a
    # second (runs end on count).
    ts = sorted([1000.0 + rng.uniform(0, n / 40) for _ in range(n // 2)])
    ts += sorted(ts[-1] + rng.uniform(0, 1) for _ in range(n - n // 2))
    sizes = [rng.choice([10, 900, 4000] * 30 + [300_000]) for _ in range(n // 2)]
    sizes += [10] * (n - n // 2)
    return [(A, 3, i, t, t, bytes(size)) for i, (t, size) in enumerate(zip(ts, sizes, strict=True))]


def mixed_log(rng: random.Random) -> list[LogRow]:
    rows = random_log(rng, 3000) + random_log(rng, 500, B)
    rows += [(B, 99, i, 5.0, 6.0, rng.randbytes(200_000)) for i in range(30)]  # big payloads
    rows += [(B, 100, i, 5.0, 6.0, b"x") for i in range(MAX_CHUNK_BATCHES + 5)]  # many
    return rows


def fleet_log(rng: random.Random) -> list[LogRow]:
    """A fleet's transaction: many streams' batches interleaved as they arrived."""
    logs = [random_log(rng, 300, StreamId(f"pod-{i}", 0)) for i in range(20)]
    return [row for rows in zip(*logs, strict=True) for row in rows]


def by_stream(rows: list[LogRow]) -> dict[StreamId, list[LogRow]]:
    grouped: dict[StreamId, list[LogRow]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    return grouped


@pytest.mark.parametrize("make", [mixed_log, fleet_log, lambda rng: steady_log(rng, 6000)])
def test_chunks_keep_every_batch_exactly_and_respect_their_bounds(make: Any) -> None:
    rows = make(random.Random(7))
    runs = split(rows)
    # Each stream's batches in the order applied; streams need not keep their interleaving.
    assert by_stream([row for run in runs for row in run]) == by_stream(rows)
    chunks = pack(rows)
    assert len(chunks) == len(runs)
    for run, chunk in zip(runs, chunks, strict=True):
        assert {(r[0], r[1]) for r in run} == {(chunk.stream, chunk.epoch)}
        assert len(run) <= MAX_CHUNK_BATCHES
        assert len(run) == 1 or sum(len(r[5]) for r in run) <= MAX_CHUNK_RAW_BYTES
        assert chunk.max_ts <= chunk.min_ts + MAX_CHUNK_SPAN_S
        assert (chunk.min_ts, chunk.max_ts) == (min(r[3] for r in run), max(r[3] for r in run))
        assert (chunk.first_seq, chunk.last_seq, chunk.batches) == (run[0][2], run[-1][2], len(run))
        unpacked = Chunk(chunk.data)
        got = [(b.seq, b.ts, b.recv_ts, b.payload) for b in map(unpacked.batch, range(len(run)))]
        assert got == [(r[2], r[3], r[4], r[5]) for r in run]
    # A new run starts only where a bound demands it: no two neighbours could have been one.
    for left, right in zip(runs, runs[1:], strict=False):
        merged = [*left, right[0]]
        assert (
            (left[0][0], left[0][1]) != (right[0][0], right[0][1])
            or len(merged) > MAX_CHUNK_BATCHES
            or sum(len(r[5]) for r in merged) > MAX_CHUNK_RAW_BYTES
            or max(r[3] for r in merged) > min(r[3] for r in merged) + MAX_CHUNK_SPAN_S
        )


def test_a_fleets_interleaved_batches_make_a_chunk_per_stream() -> None:
    streams = [StreamId(f"pod-{i}", 0) for i in range(20)]
    rows: list[LogRow] = [
        (stream, 0, seq, 1000.0 + seq / 50, 1000.0 + seq / 50, b"x" * 800)
        for seq in range(50)
        for stream in streams
    ]
    chunks = pack(rows)
    assert sorted((c.stream.replica, c.first_seq, c.last_seq) for c in chunks) == sorted(
        (s.replica, 0, 49) for s in streams
    )


def test_what_is_not_a_chunk_is_refused_clearly() -> None:
    good = pack([(A, 0, 1, 1.0, 2.0, b"p")])[0].data
    for bad in (b"", b"not zstd at all", good[:-3]):
        with pytest.raises(ChunkError):
            Chunk(bad)


def store_log(engine: Engine, rows: list[LogRow]) -> None:
    """Through the writer's own path: a transaction per few hundred rows, as it takes them."""
    writer = RowWriter(None)
    for start in range(0, len(rows), 317):
        prepared = writer.prepare(list(rows[start : start + 317]))
        with engine.begin() as conn:
            writer.write(conn, prepared)


def test_lookups_agree_with_the_plain_log(store_url: str) -> None:
    rng = random.Random(11)
    rows = random_log(rng, 2500)
    engine = open_store(store_url)
    store_log(engine, rows + random_log(rng, 300, B))
    with engine.connect() as conn:
        sid = conn.execute(select(schema.streams.c.id).where(schema.streams.c.replica == "a"))
        sid = sid.scalar_one()
        assert batch_log.count_batches(conn, sid) == len(rows)
        listed = [
            (b.epoch, b.batch.seq, b.batch.ts, b.batch.payload)
            for b in batch_log.all_batches(conn, sid)
        ]
        assert listed == [(r[1], r[2], r[3], r[5]) for r in rows]
        last_epoch = rows[-1][1]
        assert batch_log.last_epoch(conn, sid) == last_epoch
        last = batch_log.last_batch(conn, sid, last_epoch)
        assert last is not None and last.seq == rows[-1][2]

        by_epoch: dict[int, list[LogRow]] = {}
        for row in rows:
            by_epoch.setdefault(row[1], []).append(row)
        for _ in range(60):
            epoch = rng.choice(list(by_epoch))
            seqs = [r[2] for r in by_epoch[epoch]]
            seq = rng.randint(0, seqs[-1] + 2)
            before = [r for r in by_epoch[epoch] if r[2] <= seq]
            found = batch_log.batch_at_or_before(conn, sid, epoch, seq)
            assert (found and found.seq) == (before[-1][2] if before else None)
            assert (batch_log.batch_at(conn, sid, epoch, seq) is not None) == (seq in seqs)
            holding = [e for e, batches in by_epoch.items() if seq in {r[2] for r in batches}]
            held = batch_log.held_at(conn, sid, seq)
            assert [h.epoch for h in held] == sorted(holding, reverse=True)
            assert all(h.stamp.seq == seq for h in held)
            after, upto = sorted(rng.sample(range(-1, seqs[-1] + 2), 2))
            between = batch_log.batches_between(conn, sid, epoch, after, upto)
            assert [b.seq for b in between] == [s for s in seqs if after < s <= upto]
            payloads = batch_log.payloads_between(conn, sid, epoch, after, upto)
            wanted = [(r[2], r[5]) for r in by_epoch[epoch] if after < r[2] <= upto]
            assert list(payloads) == wanted

        instants = [r[3] for r in rows] + [rng.uniform(990, rows[-1][3] + 20) for _ in range(80)]
        for at in rng.sample(instants, 120):
            candidates = [(r[3], r[1], r[2]) for r in rows if r[3] <= at]
            found_at = batch_log.stamped_last_before(conn, sid, at)
            expected = max(candidates) if candidates else None
            got = found_at and (found_at.stamp.ts, found_at.epoch, found_at.stamp.seq)
            assert got == expected, at


def test_the_migration_moves_a_row_per_batch_log_into_chunks_and_back(store_url: str) -> None:
    engine = engine_at(store_url, "0005")
    rng = random.Random(3)
    rows = random_log(rng, 1200) + random_log(rng, 400, B)
    old = schema_0005_batches()
    with engine.begin() as conn:
        ids = {
            s: conn.execute(
                insert(schema.streams)
                .values(replica=s.replica, rank=0)
                .returning(schema.streams.c.id)
            ).scalar_one()
            for s in (A, B)
        }
        conn.execute(
            insert(old),
            [
                {
                    "stream_id": ids[r[0]],
                    "epoch": r[1],
                    "seq": r[2],
                    "ts": r[3],
                    "recv_ts": r[4],
                    "payload": r[5],
                }
                for r in rows
            ],
        )
    upgrade(engine)
    with engine.connect() as conn:
        for stream, sid in ids.items():
            mine = [r for r in rows if r[0] == stream]
            got = [
                (b.epoch, b.batch.seq, b.batch.ts, b.batch.recv_ts, b.batch.payload)
                for b in batch_log.all_batches(conn, sid)
            ]
            assert got == [r[1:] for r in mine]
    downgrade(engine, "0005")
    with engine.connect() as conn:
        back = conn.execute(
            select(
                old.c.stream_id, old.c.epoch, old.c.seq, old.c.ts, old.c.recv_ts, old.c.payload
            ).order_by(old.c.stream_id, old.c.epoch, old.c.seq)
        ).all()
    assert [tuple(b) for b in back] == [(ids[r[0]], *r[1:]) for r in rows]


def schema_0005_batches() -> Any:
    from sqlalchemy import BigInteger, Column, Float, Integer, LargeBinary, MetaData, Table

    return Table(
        "batches",
        MetaData(),
        Column("stream_id", Integer, primary_key=True),
        Column("epoch", Integer, primary_key=True),
        Column("seq", BigInteger, primary_key=True),
        Column("ts", Float),
        Column("recv_ts", Float),
        Column("payload", LargeBinary),
    )
