"""`batch_log.engine_time`: a collector-clock instant on the engine's clock, read from the few
chunks that can hold the batch received nearest before it (their receive-time bounds, indexed),
not from every chunk of the stream; the answer is the full scan's, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from typing import Any

import pytest
import sqlalchemy as sa

from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.backfill import backfill
from kvscope.storage.bulk_sql import insert_chunks
from kvscope.storage.engine import open_store
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk

STREAM = StreamId("a", 0)


def full_scan(conn: sa.Connection, sid: int, recv_at: float) -> float | None:
    """The rule as it was: every chunk of the stream read, in (epoch, first_seq) order."""
    before: tuple[float, float] | None = None
    after: tuple[float, float] | None = None
    t = schema.log_chunks
    query = sa.select(t.c.data).where(t.c.stream_id == sid).order_by(t.c.epoch, t.c.first_seq)
    for data in conn.execute(query).scalars():
        chunk = Chunk(data)
        for pair in zip(chunk.recv_ts, chunk.ts, strict=True):
            if pair[0] <= recv_at:
                before = pair if before is None or pair[0] >= before[0] else before
            elif after is None or pair[0] < after[0]:
                after = pair
    nearest = before or after
    return None if nearest is None else recv_at + nearest[1] - nearest[0]


def _log(seed: int) -> list[Any]:
    """Three epochs of batches: the engine clock 1000 s behind with jitter, receive times
    mostly ascending but with replayed runs received late and repeated instants (ties)."""
    rng = random.Random(seed)
    rows: list[Any] = []
    recv = 5000.0
    for epoch in range(3):
        for seq in range(1500):
            recv += rng.choice((0.0, 0.01, 0.2, 1.5))
            late = 3.0 if rng.random() < 0.05 else 0.0  # a replayed batch, received late
            ts = recv - 1000.0 + rng.uniform(-0.05, 0.05)
            rows.append((STREAM, epoch, seq, ts, recv + late, b"x" * rng.randint(1, 4000)))
    return rows


@pytest.mark.parametrize("seed", [1, 2])
def test_the_answer_is_the_full_scans_from_few_chunks(
    store_url: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_store(store_url)
    rows = _log(seed)
    chunks = pack(rows)
    assert len(chunks) > 20
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.streams).values(replica="a", rank=0))
        insert_chunks(conn, chunks, lambda _: 1)
    recvs = sorted({r[4] for r in rows})
    probes = [recvs[0] - 10.0, recvs[-1] + 10.0, *random.Random(seed).sample(recvs, 150)]
    probes += [x + 0.005 for x in probes[:50]]
    read = 0
    real_chunk = Chunk

    def counting(data: bytes) -> Chunk:
        nonlocal read
        read += 1
        return real_chunk(data)

    with engine.connect() as conn:
        want = [full_scan(conn, 1, x) for x in probes]
        monkeypatch.setattr(batch_log, "Chunk", counting)
        got = [batch_log.engine_time(conn, 1, x) for x in probes]
    assert got == want
    assert read <= 4 * len(probes) < len(chunks) * len(probes) // 5  # not every chunk each time

    # Chunks an older kvscope wrote carry no receive-time bounds: still the same answer, and
    # `kvscope db backfill` gives them theirs.
    t = schema.log_chunks
    with engine.begin() as conn:
        conn.execute(
            sa.update(t).where(t.c.first_seq < 1000).values(min_recv_ts=None, max_recv_ts=None)
        )
    with engine.connect() as conn:
        assert [batch_log.engine_time(conn, 1, x) for x in probes] == want
    backfill(engine)
    with engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).where(t.c.max_recv_ts.is_(None))).scalar() == 0
        )
        assert [batch_log.engine_time(conn, 1, x) for x in probes] == want
    engine.dispose()
