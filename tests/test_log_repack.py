"""The chunks a stream's writer stored before its first log dictionary formed, packed again
against it (storage/log_repack.py): the same batches, exactly, in fewer bytes; only while no row
waits for the writer, a short transaction at a time, rolled back with one that fails."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, FanOut, NullSink
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.leases import Fence, acquire, heartbeat, release
from kvscope.storage.log_chunks import SETTABLE_FORMATS
from kvscope.storage.log_repack import CHUNKS_PER_STEP
from kvscope.storage.log_rewrite import rewrite_chunk
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.rows import Row
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.write_loop import WriteLoop
from kvscope.storage.writer import StoreWriter
from kvscope.storage.writer_state import WriterStats
from tests.conftest import capture_path
from tests.migration_support import write
from tests.test_log_dictionary import block_log, token_pool
from tests.test_log_dictionary_store import retokened, row_writer
from tests.test_store import STREAM


def chunk_dictionaries(conn: sa.Connection) -> list[bytes | None]:
    """Each chunk's dictionary digest (None: none), in log order."""
    c = schema.log_chunks
    found = conn.execute(sa.select(c.c.dictionary).order_by(c.c.epoch, c.c.first_seq))
    return [None if d is None else bytes(d) for d in found.scalars()]


def count_repacks(writer: RowWriter, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What each of the writer's re-pack steps returned (chunks re-packed), in call order."""
    counts: list[int] = []
    step = writer.repack.step

    def counted(*args: Any) -> int:
        counts.append(step(*args))
        return counts[-1]

    monkeypatch.setattr(writer.repack, "step", counted)
    return counts


def stopped_loop(engine: sa.Engine, writer: RowWriter) -> WriteLoop:
    """A write loop whose thread has ended: the test hands it each transaction's rows
    (`_write_rows`) and its idle steps (`idle`), as its queue's takes would, the queue open and
    empty unless the test puts rows in it."""
    closed: RowQueue[Row] = RowQueue(1 << 20)
    closed.close()
    loop = WriteLoop(engine, closed, writer, StoreSettings(), WriterStats())
    loop.thread.join()
    loop.queue = RowQueue(1 << 20, linger_s=0.2)
    return loop


def idle(loop: WriteLoop) -> None:
    """The loop's idle steps, until it has none to do (as its take does, waiting for rows)."""
    while loop._idle_step():
        pass


@pytest.mark.parametrize("fmt", SETTABLE_FORMATS)
def test_after_the_first_dictionary_no_chunk_is_in_the_pre_dictionary_layout(
    store_url: str, fmt: int
) -> None:
    engine = open_store(store_url)
    rows = block_log(random.Random(4), 1200, token_pool(random.Random(4), 40))
    writer = row_writer(fmt=fmt)
    sizes = []
    for start in range(0, len(rows), 10):
        write(engine, writer, rows[start : start + 10])
        with engine.connect() as conn:
            sizes.append(chunk_dictionaries(conn))
    first = next(i for i, named in enumerate(sizes) if any(named))
    # Chunks stored before it, more than one step re-writes.
    assert len(sizes[first - 1]) > CHUNKS_PER_STEP
    assert sizes[-1][: len(sizes[first - 1])] == sizes[first - 1]  # none while rows come
    idle(stopped_loop(engine, writer))
    with engine.connect() as conn:
        assert None not in chunk_dictionaries(conn)
        sid = conn.execute(sa.select(schema.streams.c.id)).scalar_one()
        got = [(b.batch.seq, b.batch.ts, b.batch.payload) for b in batch_log.all_batches(conn, sid)]
        assert got == [(r[2], r[3], r[5]) for r in rows]
    engine.dispose()


def test_re_packing_waits_while_rows_wait_and_runs_once_the_writer_idles(
    store_url: str,
) -> None:
    engine = open_store(store_url)
    rows = block_log(random.Random(5), 1200, token_pool(random.Random(5), 40))
    writer = row_writer()
    loop = stopped_loop(engine, writer)
    for start in range(0, len(rows), 10):
        loop._write_rows(list[Row](rows[start : start + 10]))
    with engine.connect() as conn:
        before = chunk_dictionaries(conn)
    assert any(before) and before.count(None) > CHUNKS_PER_STEP
    assert writer.idle_work
    # A whole take queued (a backlog): taken at once, no step.
    for row in rows[:5]:
        loop.queue.put(row, True)
    assert loop.queue.take(5, loop._idle_step) == rows[:5]
    assert loop.stats.idle_steps == 0
    # Fewer: the take lingers for more, and steps fill the wait.
    loop.queue.put(rows[5], True)
    assert loop.queue.take(5, loop._idle_step) == rows[5:6]
    assert loop.stats.idle_steps >= 1
    idle(loop)  # none queued: the writer idles
    assert not writer.idle_work
    assert loop.stats.idle_chunks == before.count(None)
    assert loop.stats.idle_chunks <= loop.stats.idle_steps * CHUNKS_PER_STEP
    with engine.connect() as conn:
        assert None not in chunk_dictionaries(conn)
        sid = conn.execute(sa.select(schema.streams.c.id)).scalar_one()
        got = [(b.batch.seq, b.batch.payload) for b in batch_log.all_batches(conn, sid)]
        assert got == [(r[2], r[5]) for r in rows]
    engine.dispose()


def test_repacked_chunks_rebuild_every_instant_exactly(store_url: str) -> None:
    pool = token_pool(random.Random(1), 200)
    settings = StoreSettings(
        checkpoint_every_batches=700, rows_per_transaction=300, log_dictionary_ratio=0.5
    )
    writer = StoreWriter(open_store(store_url), settings)
    samples: dict[int, dict[tuple[int, int], int]] = {}
    rng = random.Random(3)

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if rng.randrange(40) == 0:
                samples[batch.seq] = ingest.map.counts()

    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(writer, Sample()))
    for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
        ingest.live_frames(retokened(record.frames, pool), record.recv_ts)
    assert writer.flush(idle_work=True)
    writer.close()
    assert writer.stats.batches_dropped == 0 and len(samples) > 50
    assert writer.stats.idle_chunks > 0
    engine = open_store(store_url)
    with engine.connect() as conn:
        named = chunk_dictionaries(conn)
        assert len(named) > CHUNKS_PER_STEP and None not in named
        sid = stream_id(conn, STREAM.replica)
        for seq, live in samples.items():
            assert rebuild(conn, position_at_seq(conn, sid, seq), STREAM).map.counts() == live
    engine.dispose()


def test_a_chunk_gone_meanwhile_is_left_alone(store_url: str) -> None:
    """Retention may take a chunk between the writer's statements (PostgreSQL)."""
    engine = open_store(store_url)
    rows = block_log(random.Random(6), 20, token_pool(random.Random(6), 40))
    write(engine, row_writer(), rows)
    with engine.begin() as conn:
        sid = conn.execute(sa.select(schema.streams.c.id)).scalar_one()
        assert not rewrite_chunk(conn, schema.log_chunks, (sid, 0, len(rows) + 5), 5, None)
        assert chunk_dictionaries(conn) == [None]
    engine.dispose()


def test_a_chunk_that_cannot_be_read_costs_no_other_row(tmp_path: object) -> None:
    """A damaged pre-dictionary chunk is passed by (and counted): the stream's new rows are
    written all the same, where each transaction failed on it before."""
    engine = open_store(f"sqlite:///{tmp_path}/k.sqlite")
    rows = block_log(random.Random(4), 1200, token_pool(random.Random(4), 40))
    writer = row_writer()
    write(engine, writer, rows[:10])
    with engine.begin() as conn:
        conn.execute(sa.update(schema.log_chunks).values(data=b"\x28\xb5\x2f\xfdgarbage"))
    for start in range(10, len(rows), 10):
        write(engine, writer, rows[start : start + 10])
    idle(stopped_loop(engine, writer))
    assert not writer.idle_work
    with engine.connect() as conn:
        assert None in chunk_dictionaries(conn)  # the damaged one, left as it was
        later = batch_log.batches_between(conn, 1, rows[10][1], rows[9][2], 2**63 - 1)
        assert [b.seq for b in later] == [r[2] for r in rows[10:]]
    assert writer.repack.unreadable == 1
    engine.dispose()


def test_a_fleet_re_packs_a_bounded_number_a_transaction_and_every_stream_finishes(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an upgrade every stream has old chunks: a step re-packs at most `CHUNKS_PER_STEP`
    of them in all, not that many per stream, and taking turns, each stream's are all re-packed
    in the end."""
    engine = open_store(f"sqlite:///{tmp_path}/k.sqlite")
    streams = [StreamId(f"r{i}", 0) for i in range(12)]
    logs = [
        block_log(random.Random(i), 400, token_pool(random.Random(i), 40), s)
        for i, s in enumerate(streams)
    ]
    writer = row_writer()
    per_step = count_repacks(writer, monkeypatch)
    for start in range(0, 400, 10):
        write(engine, writer, [r for log in logs for r in log[start : start + 10]])
    idle(stopped_loop(engine, writer))
    assert 0 < max(per_step) <= CHUNKS_PER_STEP
    with engine.connect() as conn:
        assert None not in chunk_dictionaries(conn)
        for s, log in zip(streams, logs, strict=True):
            sid = stream_id(conn, s.replica)
            got = [(b.batch.seq, b.batch.payload) for b in batch_log.all_batches(conn, sid)]
            assert got == [(r[2], r[5]) for r in log]
    engine.dispose()


class RefusesOnce:
    """An engine whose transaction fails for good (a value the store cannot hold, not a store
    that is down) once `refuse` says so, after the writer's statements ran: all rolled back."""

    def __init__(self, engine: sa.Engine, refuse: Callable[[], bool]) -> None:
        self.engine, self.refuse, self.refused = engine, refuse, False

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        with self.engine.begin() as conn:
            yield conn
            if not self.refused and self.refuse():
                self.refused = True
                raise ValueError("a value the store cannot hold")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_a_step_that_fails_is_rolled_back_and_done_again(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step the store refuses leaves the old bytes (never neither), and its chunks (and the
    streams it found done) are taken again by a later step."""
    engine = open_store(f"sqlite:///{tmp_path}/k.sqlite")
    rows = block_log(random.Random(5), 1210, token_pool(random.Random(5), 40))
    writer = row_writer()
    taken = count_repacks(writer, monkeypatch)
    loop = stopped_loop(engine, writer)
    for start in range(0, 1200, 10):
        loop._write_rows(list[Row](rows[start : start + 10]))
    with engine.connect() as conn:
        before = chunk_dictionaries(conn)
    # The last step finds the stream done: refused, that must not count.
    steps = -(-before.count(None) // CHUNKS_PER_STEP)
    failing = RefusesOnce(engine, lambda: len(taken) == steps)
    loop.engine = failing  # type: ignore[assignment]  # duck-typed stand-in
    idle(loop)
    assert failing.refused and writer.idle_work
    assert not loop._idle_step()  # none until a transaction of rows
    with engine.connect() as conn:
        after = chunk_dictionaries(conn)
    assert after.count(None) == before.count(None) - CHUNKS_PER_STEP * (steps - 1) > 0
    loop._write_rows(list[Row](rows[1200:]))
    idle(loop)
    assert not writer.idle_work
    with engine.connect() as conn:
        assert None not in chunk_dictionaries(conn)
        sid = conn.execute(sa.select(schema.streams.c.id)).scalar_one()
        got = [(b.batch.seq, b.batch.payload) for b in batch_log.all_batches(conn, sid)]
        assert got == [(r[2], r[5]) for r in rows]
    engine.dispose()


def test_flush_with_idle_work_says_so_when_a_step_failed(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed step is done again only after the next transaction of rows: a flush that waits
    for the idle work must not report the store as compact as it gets meanwhile."""
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path}/k.sqlite"), StoreSettings())
    rows = block_log(random.Random(5), 1200, token_pool(random.Random(5), 40))
    sql = writer._loop.sql

    def refused(conn: sa.Connection) -> int:
        raise ValueError("a value the store cannot hold")

    monkeypatch.setattr(sql, "idle_step", refused)
    for start in range(0, len(rows), 10):
        for row in rows[start : start + 10]:
            writer._queue.put(row, True)
        assert writer.flush()
    assert sql.idle_work  # re-packing left: its step failed
    assert not writer.flush(5.0, idle_work=True)
    writer.close()


def grant_writes(conn: sa.Connection) -> dict[tuple[StreamId, int], int]:
    """Each lease grant's count of write transactions, by stream and token."""
    g = schema.lease_grants
    found = conn.execute(sa.select(g.c.replica, g.c.rank, g.c.token, g.c.writes))
    return {(StreamId(r.replica, r.rank), r.token): r.writes for r in found}


def stream_dictionaries(conn: sa.Connection, streams: list[StreamId]) -> list[list[bytes | None]]:
    """Each stream's chunks' dictionary digests, in log order."""
    c = schema.log_chunks
    return [
        [
            None if d is None else bytes(d)
            for d in conn.execute(
                sa.select(c.c.dictionary)
                .where(c.c.stream_id == stream_id(conn, s.replica, s.rank))
                .order_by(c.c.epoch, c.c.first_seq)
            ).scalars()
        ]
        for s in streams
    ]


def leased_fleet(engine: sa.Engine, streams: list[StreamId]) -> tuple[RowWriter, Fence]:
    """A writer of member "a", fenced, that holds every stream of `streams` and has written
    each one's log (chunks before and after its first dictionary)."""
    fence = Fence("a")
    with engine.begin() as conn:
        heartbeat(conn, "a", 60.0)
        for s in streams:
            grant = acquire(conn, s, "a")
            assert grant is not None
            fence.hold(s, grant.token)
    writer = row_writer()
    writer.fence = fence
    logs = [
        block_log(random.Random(i), 400, token_pool(random.Random(i), 40), s)
        for i, s in enumerate(streams)
    ]
    for start in range(0, 400, 10):
        write(engine, writer, [r for log in logs for r in log[start : start + 10]])
    return writer, fence


def test_an_idle_step_counts_a_lease_write_only_for_the_streams_it_re_packs(
    pg_url: str,
) -> None:
    """`lease_grants.writes` (and `last_write_at`) say when a holder wrote its stream: a step
    that re-packs some streams' chunks counts a write for those, not for every stream that has
    chunks left."""
    engine = open_store(pg_url)
    streams = [StreamId(f"r{i}", 0) for i in range(4)]
    writer, _ = leased_fleet(engine, streams)
    loop = stopped_loop(engine, writer)
    steps = 0
    while True:
        with engine.connect() as conn:
            chunks, writes = stream_dictionaries(conn, streams), grant_writes(conn)
        if not loop._idle_step():
            break
        steps += 1
        with engine.connect() as conn:
            now = stream_dictionaries(conn, streams)
            counted = {s for (s, _), n in grant_writes(conn).items() if n != writes[(s, 1)]}
        re_packed = {s for s, old, new in zip(streams, chunks, now, strict=True) if old != new}
        assert counted == re_packed, steps
    assert steps > 1
    with engine.connect() as conn:
        assert all(None not in named for named in stream_dictionaries(conn, streams))
    engine.dispose()


def test_an_idle_step_re_packs_no_chunk_of_a_stream_taken_over(pg_url: str) -> None:
    """Re-packing writes a stream's chunks: fenced as any write, it leaves a stream whose lease
    names another member (taken while this one did not know) to that member, and counts no write
    on either grant."""
    engine = open_store(pg_url)
    streams = [StreamId(f"r{i}", 0) for i in range(3)]
    writer, fence = leased_fleet(engine, streams)
    taken = streams[1]
    with engine.begin() as conn:
        release(conn, taken, "a", fence.held()[taken])  # as if it had expired
        heartbeat(conn, "b", 60.0)
        assert acquire(conn, taken, "b") is not None
        before, writes = stream_dictionaries(conn, streams), grant_writes(conn)
    assert None in before[1]
    idle(stopped_loop(engine, writer))
    with engine.connect() as conn:
        after, now = stream_dictionaries(conn, streams), grant_writes(conn)
    assert after[1] == before[1]  # b's to re-pack
    assert None not in after[0] and None not in after[2]
    assert now[(taken, 1)] == writes[(taken, 1)] and now[(taken, 2)] == 0
    assert not writer.idle_work
    engine.dispose()


@pytest.mark.parametrize("leased", [False, True])
def test_a_step_re_writes_its_chunks_in_one_update_on_postgresql(pg_url: str, leased: bool) -> None:
    """A step's chunks, of one stream or several, go in one UPDATE (a round trip each
    before), the lease admitted ahead of it in the step's transaction."""
    engine = open_store(pg_url)
    streams = [StreamId(f"r{i}", 0) for i in range(3)]
    if leased:
        writer, _ = leased_fleet(engine, streams)
    else:
        writer = row_writer()
        logs = [
            block_log(random.Random(i), 400, token_pool(random.Random(i), 40), s)
            for i, s in enumerate(streams)
        ]
        for start in range(0, 400, 10):
            write(engine, writer, [r for log in logs for r in log[start : start + 10]])
    loop = stopped_loop(engine, writer)
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    steps = 0
    while True:
        sent.clear()
        taken = loop.stats.idle_chunks
        if not loop._idle_step():
            break
        taken = loop.stats.idle_chunks - taken
        updates = [s for s in sent if s.lstrip().upper().startswith("UPDATE")]
        assert len(updates) == (1 if taken else 0), (steps, taken, updates)
        steps += taken > 0
    assert steps > 1
    with engine.connect() as conn:
        assert all(None not in named for named in stream_dictionaries(conn, streams))
    engine.dispose()
