"""Leases on the real PostgreSQL: acquire, renew, expiry, release, and fencing at every write.

A member's expiry is waited for (a short TTL, then a condition), never timed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.cli import app as cli
from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import copy_map
from kvscope.collector.types import Batch, StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.autocommit import writing
from kvscope.storage.engine import open_store, upgrade
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.leases import (
    Fence,
    Grant,
    LeaseError,
    acquire,
    check_backend,
    forget_dead,
    heartbeat,
    leases,
    leave,
    live_members,
    owned,
    owner_of,
    release,
)
from kvscope.storage.prepared import Prepared
from kvscope.storage.resume import resume_point
from kvscope.storage.retention import DAY, Retention, prune
from kvscope.storage.rows import CheckpointRow, LogRow, RollupRow, Row
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.migration_support import downgrade, engine_at
from tests.test_log_dictionary import block_log, token_pool
from tests.test_prefix_map import stored

STREAM = StreamId("lab", 0)
SHORT_TTL = 0.3


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def dead(engine: sa.Engine, member: str) -> Callable[[], bool]:
    def check() -> bool:
        with engine.connect() as conn:
            return member not in live_members(conn)

    return check


def test_0011_adds_the_lease_tables_and_goes_back(store_url: str) -> None:
    engine = engine_at(store_url, "0010")
    tables = {"lease_members", "stream_leases", "lease_grants"}
    with engine.connect() as conn:
        assert not tables & set(sa.inspect(conn).get_table_names())
    upgrade(engine)
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        for name in tables:
            got = {c["name"] for c in inspector.get_columns(name)}
            assert got == {c.name for c in schema.metadata.tables[name].columns}
    downgrade(engine, "0010")
    with engine.connect() as conn:
        left = set(sa.inspect(conn).get_table_names())
        assert not tables & left and "reset_prefix_groups" in left
    upgrade(engine)
    engine.dispose()


def test_sqlite_is_refused_with_a_reason() -> None:
    with pytest.raises(LeaseError, match="PostgreSQL"):
        check_backend("sqlite")


def test_acquire_renew_expire_release(pg_url: str) -> None:
    engine = open_store(pg_url)
    with engine.begin() as conn:
        heartbeat(conn, "a", 60)
        heartbeat(conn, "b", 60)
    with engine.begin() as conn:
        assert acquire(conn, STREAM, "a") == Grant(1, False)
    with engine.begin() as conn:
        assert acquire(conn, STREAM, "b") is None  # a live member holds it
    with engine.begin() as conn:
        assert release(conn, STREAM, "a", 1)
        assert acquire(conn, STREAM, "b") == Grant(2, False)
        assert owned(conn, "b") == {STREAM: 2} and owned(conn, "a") == {}

    # b stops beating: a takes the stream over with the next token.
    with engine.begin() as conn:
        heartbeat(conn, "b", SHORT_TTL)
    wait_until(dead(engine, "b"), "b's heartbeat to expire")
    with engine.begin() as conn:
        assert leases(conn)[STREAM].live is False
        assert acquire(conn, STREAM, "a") == Grant(3, True)
    # b beats again: alive, but the stream is a's now.
    with engine.begin() as conn:
        heartbeat(conn, "b", 60)
        assert owned(conn, "b") == {} and leases(conn)[STREAM].owner == "a"

    # A heartbeat renews: a lapses, beats again, and holds its lease again.
    with engine.begin() as conn:
        heartbeat(conn, "a", SHORT_TTL)
    wait_until(dead(engine, "a"), "a's heartbeat to expire")
    with engine.begin() as conn:
        heartbeat(conn, "a", 60)
    with engine.begin() as conn:
        assert acquire(conn, STREAM, "b") is None
        assert leases(conn)[STREAM].live

    with engine.begin() as conn:
        leave(conn, "a")
        assert live_members(conn) == ["b"]
        assert leases(conn)[STREAM].owner is None
        # A member killed long ago (it never left) is forgotten; live ones stay.
        conn.execute(
            sa.insert(schema.lease_members).values(
                id="killed",
                started_at=sa.func.now() - sa.text("interval '3 hours'"),
                expires_at=sa.func.now() - sa.text("interval '2 hours'"),
            )
        )
        assert forget_dead(conn) == 1
        assert forget_dead(conn) == 0 and live_members(conn) == ["b"]
    with engine.connect() as conn:
        g = schema.lease_grants
        grants = conn.execute(
            sa.select(g.c.token, g.c.owner, g.c.takeover, g.c.released_at.is_not(None)).order_by(
                g.c.token
            )
        ).all()
    assert [tuple(r) for r in grants] == [
        (1, "a", False, True),
        (2, "b", False, False),  # never released: taken over
        (3, "a", True, True),
    ]
    engine.dispose()


def feed(ingest: StreamIngest, records: Iterable[CaptureRecord]) -> None:
    for record in records:
        ingest.live_frames(record.frames, record.recv_ts)


def stored_batches(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return batch_log.count_batches(conn, epoch=0)


def test_a_stale_token_writes_nothing_and_the_next_holder_resumes(pg_url: str) -> None:
    engine = open_store(pg_url)
    records = list(read_capture(capture_path("lab_3rps_180s.msgpack.gz")))
    half = len(records) // 2
    with engine.begin() as conn:
        heartbeat(conn, "a", SHORT_TTL)
        grant = acquire(conn, STREAM, "a")
    assert grant is not None
    token_a = grant.token
    lost: list[StreamId] = []
    fence_a = Fence("a", lost.append)
    fence_a.hold(STREAM, token_a)
    writer_a = StoreWriter(engine, fence=fence_a)
    ingest_a = StreamIngest(STREAM, can_replay=False, sink=writer_a)
    feed(ingest_a, records[:half])
    assert writer_a.flush()
    before = stored_batches(engine)
    assert before == ingest_a.counters.batches_applied and not lost

    # a's heartbeat stops (a paused process, say); b takes the stream over.
    wait_until(dead(engine, "a"), "a's heartbeat to expire")
    with engine.begin() as conn:
        heartbeat(conn, "b", 60)
        taken = acquire(conn, STREAM, "b")
    assert taken == Grant(token_a + 1, True)
    token_b = taken.token
    point = resume_point(engine, STREAM)
    assert point is not None and point.last_seq == ingest_a.last_seq

    # a goes on with its old token: every row refused, nothing lands.
    feed(ingest_a, records[half:])
    writer_a.flush()
    writer_a.close()
    assert stored_batches(engine) == before
    assert set(lost) == {STREAM} and fence_a.refused_rows > 0
    assert writer_a.stats.rows_refused == 0  # fenced off, not a store error

    # b resumes from the store and writes on: the stored map is the one a followed.
    fence_b = Fence("b")
    fence_b.hold(STREAM, token_b)
    writer_b = StoreWriter(engine, fence=fence_b)
    ingest_b = StreamIngest(STREAM, can_replay=False, sink=writer_b)
    ingest_b.resume(point)
    feed(ingest_b, records[half:])
    writer_b.close()
    assert ingest_b.map.counts() == ingest_a.map.counts()
    with engine.connect() as conn:
        assert batch_log.count_batches(conn, epoch=0) == ingest_a.counters.batches_applied
        sid = stream_id(conn, STREAM.replica)
        assert ingest_a.last_seq is not None
        rebuilt = rebuild(conn, position_at_seq(conn, sid, ingest_a.last_seq), STREAM)
        assert rebuilt.map.counts() == ingest_a.map.counts()
        g = schema.lease_grants
        writes = conn.execute(
            sa.select(g.c.token, g.c.granted_at, g.c.first_write_at, g.c.last_write_at).order_by(
                g.c.token
            )
        ).all()
    (ta, _, _, a_last), (tb, b_granted, b_first, _) = writes
    assert (ta, tb) == (token_a, token_b)
    assert a_last < b_granted <= b_first  # a's writes all landed before b held the stream

    # GET /replicas says who holds each stream.
    answer = TestClient(create_app(ApiData(engine=engine))).get("/replicas")
    assert answer.status_code == 200, answer.text
    (rank,) = answer.json()[0]["ranks"]
    assert rank["lease"] == {"owner": "b", "token": token_b, "live": True}
    engine.dispose()


def _granted_to_a_beside_b(engine: sa.Engine) -> int:
    """Members a (its heartbeat about to expire) and b (live); a granted the stream: its
    token."""
    with engine.begin() as conn:
        heartbeat(conn, "a", SHORT_TTL)
        heartbeat(conn, "b", 60)
        grant = acquire(conn, STREAM, "a")
    assert grant is not None
    return grant.token


def test_a_write_in_flight_holds_off_a_takeover(pg_url: str) -> None:
    """The fence locks the lease row until its transaction ends: a taker waits for it (here
    it gives up at once, with lock_timeout), so no write lands after the token changed."""
    engine = open_store(pg_url)
    token = _granted_to_a_beside_b(engine)
    fence = Fence("a")
    fence.hold(STREAM, token)
    wait_until(dead(engine, "a"), "a's heartbeat to expire")
    with engine.connect() as writing:
        with writing.begin():
            assert fence.admit(writing, {STREAM, StreamId("other", 0)}) == {STREAM}
            with engine.connect() as taking, taking.begin():
                taking.execute(sa.text("SET LOCAL lock_timeout = '100ms'"))
                with pytest.raises(OperationalError, match="lock timeout"):
                    acquire(taking, STREAM, "b")
        with engine.begin() as taking:
            assert acquire(taking, STREAM, "b") == Grant(token + 1, True)
        with writing.begin():
            assert fence.admit(writing, {STREAM}) == set()
    engine.dispose()


def test_a_member_that_joins_or_leaves_moves_only_its_share() -> None:
    streams = [StreamId(f"r{i}", rank) for i in range(30) for rank in (0, 1)]
    three = {s: owner_of(s, ["a", "b", "c"]) for s in streams}
    assert set(three.values()) == {"a", "b", "c"}
    four = {s: owner_of(s, ["c", "d", "b", "a"]) for s in streams}  # order does not matter
    assert {s for s in streams if three[s] != four[s]} == {s for s in streams if four[s] == "d"}
    two = {s: owner_of(s, ["a", "b"]) for s in streams}
    assert {s for s in streams if three[s] != two[s]} == {s for s in streams if three[s] == "c"}
    assert owner_of(STREAM, []) is None


def test_old_grants_are_pruned_but_never_the_token(pg_url: str) -> None:
    """`lease_grants` is pruned by age (retention), but for each stream's current grant; the
    token lives in `stream_leases`, which pruning leaves alone: the next grant is still one
    more than every token ever granted."""
    engine = open_store(pg_url)
    other = StreamId("lab", 1)
    with engine.begin() as conn:
        heartbeat(conn, "a", 60)
    for _ in range(3):  # tokens 1..3 of STREAM, the last one held
        with engine.begin() as conn:
            grant = acquire(conn, STREAM, "a")
            assert grant is not None
            if grant.token < 3:
                release(conn, STREAM, "a", grant.token)
    with engine.begin() as conn:
        assert acquire(conn, other, "a") == Grant(1, False)
        release(conn, other, "a", 1)  # released: no current holder, its token stays 1
    g = schema.lease_grants
    with engine.begin() as conn:  # everything but STREAM's grant 2 happened two days ago
        conn.execute(
            sa.update(g)
            .where(sa.tuple_(g.c.replica, g.c.rank, g.c.token) != ("lab", 0, 2))
            .values(
                granted_at=sa.func.now() - sa.text("interval '2 days'"),
                released_at=sa.case(
                    (g.c.released_at.is_(None), None),
                    else_=sa.func.now() - sa.text("interval '2 days'"),
                ),
            )
        )
    pruned = prune(engine, Retention(None, None, None, lease_grants_s=DAY), time.time())
    assert pruned.lease_grants == 2  # STREAM's token 1 and other's token 1
    with engine.connect() as conn:
        kept = {tuple(r) for r in conn.execute(sa.select(g.c.replica, g.c.rank, g.c.token))}
    assert kept == {("lab", 0, 2), ("lab", 0, 3)}  # 3: held, however old
    with engine.begin() as conn:
        release(conn, STREAM, "a", 3)
        assert acquire(conn, STREAM, "a") == Grant(4, False)
        assert acquire(conn, other, "a") == Grant(2, False)
    # `kvscope prune`: the default keeps a week, --lease-grant-days says otherwise.
    with engine.begin() as conn:
        conn.execute(
            sa.update(g)
            .where(g.c.replica == "lab", g.c.rank == 0, g.c.token == 2)
            .values(released_at=sa.func.now() - sa.text("interval '2 days'"))
        )
    for flags, said in (([], "0 lease grants"), (["--lease-grant-days", "1"], "1 lease grants")):
        result = CliRunner().invoke(cli, ["prune", "--store", pg_url, *flags])
        assert said in " ".join(result.output.split()), result.output
    engine.dispose()


def _next_log_alone(engine: sa.Engine, writer: RowWriter, rows: Iterator[list[LogRow]]) -> Prepared:
    """The next of `rows`' takes that `writer` writes as one statement; those before it (a
    stream's first, a dictionary's) written in transactions."""
    for take in rows:
        prepared = writer.prepare(list[Row](take))
        if writer.one_statement(prepared, "postgresql"):
            return prepared
        with engine.begin() as conn:
            writer.write(conn, prepared)
        writer.committed(prepared)
    raise AssertionError("no take written as one statement")


def test_a_write_of_the_log_alone_checks_its_lease_in_its_one_statement(pg_url: str) -> None:
    """Under leases, a write of the log alone is one statement too, sent outside a transaction
    (storage/autocommit.py): its lease check rides in it. A takeover in flight holds it off
    (the lease row locked), and once the token changed it lands nothing, as a stale writer's."""
    engine = open_store(pg_url)
    token = _granted_to_a_beside_b(engine)
    lost: list[StreamId] = []
    fence = Fence("a", lost.append)
    fence.hold(STREAM, token)
    writer = RowWriter(None, fence=fence)
    log = [
        (STREAM, 0, *r[2:])
        for r in block_log(random.Random(3), 3000, token_pool(random.Random(3), 40))
    ]
    takes = (log[i : i + 100] for i in range(0, len(log), 100))
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    def writes() -> int:
        with engine.connect() as conn:
            g = schema.lease_grants
            return int(conn.execute(sa.select(g.c.writes).where(g.c.token == token)).scalar_one())

    prepared = _next_log_alone(engine, writer, takes)
    written, stored = writes(), stored_batches(engine)
    statements.clear()
    with writing(engine, True) as conn:
        writer.write(conn, prepared)
        assert conn.get_execution_options()["isolation_level"] == "AUTOCOMMIT"
    writer.committed(prepared)
    assert len(statements) == 1 and statements[0].startswith("WITH held AS (SELECT")
    assert stored_batches(engine) == stored + len(prepared.log) and writes() == written + 1
    assert not lost

    # b takes the stream over while a writes: a's statement waits for the lease row.
    wait_until(dead(engine, "a"), "a's heartbeat to expire")
    prepared = _next_log_alone(engine, writer, takes)
    stored, written = stored_batches(engine), writes()
    with engine.connect() as taking:
        with taking.begin():
            assert acquire(taking, STREAM, "b") == Grant(token + 1, True)
            thread = threading.Thread(target=lambda: _write_alone(engine, writer, prepared))
            thread.start()
            wait_until(lambda: _waiting_for_a_lock(engine), "a's write to wait for the lease")
        thread.join()
    assert lost == [STREAM] and fence.refused_rows > 0
    assert not prepared.log and not prepared.chunks
    assert stored_batches(engine) == stored and writes() == written
    engine.dispose()


def _write_alone(engine: sa.Engine, writer: RowWriter, prepared: Prepared) -> None:
    with writing(engine, True) as conn:
        writer.write(conn, prepared)
    writer.committed(prepared)


def _waiting_for_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        query = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return bool(conn.exec_driver_sql(query).scalar())


def _checkpoint(stream: StreamId, seq: int) -> CheckpointRow:
    prefix_map = PrefixMap(stream)
    prefix_map.apply(Batch(seq, float(seq), 0, [stored([1, 2, 3], None)]))
    return CheckpointRow(stream, 0, seq, float(seq), 3, copy_map(prefix_map))


def test_a_one_statement_write_leaves_out_every_table_of_a_stream_it_lost(pg_url: str) -> None:
    """In the log's one statement, the lease check leaves out the rows of every table (chunks,
    checkpoints, rollups) of a stream taken over, and counts them refused; the stream still
    held lands all of its rows, its checkpoint given twice under one key written once."""
    engine = open_store(pg_url)
    held, taken = StreamId("held", 0), StreamId("taken", 0)
    with engine.begin() as conn:
        heartbeat(conn, "a", 60)
        heartbeat(conn, "b", 60)
        tokens = {s: acquire(conn, s, "a").token for s in (held, taken)}  # type: ignore[union-attr]
    lost: list[StreamId] = []
    fence = Fence("a", lost.append)
    for stream, token in tokens.items():
        fence.hold(stream, token)
    writer = RowWriter(None, fence=fence)
    pool = token_pool(random.Random(1), 40)
    logs = {s: block_log(random.Random(i), 200, pool, s) for i, s in enumerate((held, taken))}
    first = writer.prepare([*logs[held][:100], *logs[taken][:100]])  # the streams' ids made
    with engine.begin() as conn:
        writer.write(conn, first)
    writer.committed(first)
    with engine.begin() as conn:
        assert release(conn, taken, "a", tokens[taken])
        assert acquire(conn, taken, "b") is not None
    take: list[Row] = [*logs[held][100:], *logs[taken][100:]]
    take += [RollupRow(s, 0, "GPU", 0, 1, 1, 0, 1, 0, 0, 0) for s in (held, taken)]
    take += [_checkpoint(held, 150), _checkpoint(taken, 150), _checkpoint(held, 150)]
    prepared = writer.prepare(take)
    assert writer.one_statement(prepared, "postgresql")
    _write_alone(engine, writer, prepared)
    assert lost == [taken] and fence.refused_rows == 100 + 1 + 1
    with engine.connect() as conn:
        ids = dict(conn.execute(sa.select(schema.streams.c.replica, schema.streams.c.id)).all())
        for table in (schema.checkpoints, schema.rollups):
            query = sa.select(table.c.stream_id, sa.func.count()).group_by(table.c.stream_id)
            assert conn.execute(query).tuples().all() == [(ids["held"], 1)], table.name
        assert batch_log.count_batches(conn, ids["held"]) == 200
        assert batch_log.count_batches(conn, ids["taken"]) == 100
    engine.dispose()


def test_a_write_in_flight_sees_its_own_members_next_token(pg_url: str) -> None:
    """The lease check's token test (a join on the tokens sent) is made again on the lease row
    a taker changed, not only its owner: re-granted to the same member with the next token
    while a write of the old one waits, the write lands nothing of that stream."""
    engine = open_store(pg_url)
    other = StreamId("lab", 1)
    with engine.begin() as conn:
        heartbeat(conn, "a", 60)
        tokens = {s: acquire(conn, s, "a").token for s in (STREAM, other)}  # type: ignore[union-attr]
    fence = Fence("a")
    for stream, token in tokens.items():
        fence.hold(stream, token)
    admitted: list[set[StreamId]] = []
    with engine.connect() as taking:
        with taking.begin():
            assert release(taking, STREAM, "a", tokens[STREAM])
            assert acquire(taking, STREAM, "a") == Grant(tokens[STREAM] + 1, False)

            def write() -> None:
                with engine.begin() as conn:
                    admitted.append(fence.admit(conn, {STREAM, other}))

            thread = threading.Thread(target=write)
            thread.start()
            wait_until(lambda: _waiting_for_a_lock(engine), "the write to wait for the lease")
        thread.join()
    assert admitted == [{other}]
    engine.dispose()
