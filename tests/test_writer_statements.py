"""The statements the writer issues per transaction: each is a GIL hand-back (several, with
sqlite3) that the ingest thread may have to wait out, so none is issued that the store's state
does not need.

The writer's loop runs on this thread after the whole capture is queued (as
benchmarks/store_instructions.py runs it): which rows share a transaction then depends on
`rows_per_transaction` alone, not on timing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, text

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.leases import Fence
from kvscope.storage.prepared import Prepared
from kvscope.storage.recovery import RecoveryPoint
from kvscope.storage.rows import RecoveryRow, RollupRow
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.write_loop import WriteLoop
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_ingest import CLEAR, frames, payload, store

STREAM = StreamId("lab", 0)


def _write_inline(
    engine: Engine,
    rows_per_transaction: int,
    monkeypatch: pytest.MonkeyPatch,
    autocommit: list[bool] | None = None,
) -> list[list[str]]:
    """The lab capture through a writer whose loop runs here once all is queued; each
    transaction's statements; in `autocommit`, whether each was sent outside a transaction
    (no BEGIN and COMMIT: storage/autocommit.py)."""
    run = WriteLoop._run
    monkeypatch.setattr(WriteLoop, "_run", lambda self: None)
    settings = StoreSettings(
        rows_per_transaction=rows_per_transaction,
        queue_rows=10**9,
        queue_bytes=2**40,
        spill_bytes=0,
        checkpoint_every_batches=300,
    )
    writer = StoreWriter(engine, settings)
    monkeypatch.undo()
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close(0)
    transactions: list[list[str]] = []

    def begun(conn: Any) -> None:
        transactions.append([])
        if autocommit is not None:
            autocommit.append(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

    def executed(*args: Any) -> None:
        # executemany: sqlite3 steps (and hands the GIL back) once per row.
        transactions[-1].append(("many: " if args[5] else "") + " ".join(args[2].split()[:4]))

    event.listen(engine, "begin", begun)
    event.listen(engine, "before_cursor_execute", executed)
    run(writer._loop)
    event.remove(engine, "begin", begun)
    event.remove(engine, "before_cursor_execute", executed)
    assert writer.failure is None and writer.stats.rows_refused == 0
    return transactions


def _recoveries(engine: Engine) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    r, rr = schema.resets, schema.reset_recovery
    with engine.connect() as conn:
        resets = conn.execute(select(r).order_by(r.c.id)).tuples().all()
        points = conn.execute(select(rr).order_by(rr.c.reset_id, rr.c.offset_s)).tuples().all()
    return list(resets), list(points)


def test_batches_alone_cost_one_statement_per_table(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions = _write_inline(open_store(store_url), 200, monkeypatch)
    assert len(transactions) > 10
    # The stream's id and its epoch are looked up once, in the first transaction.
    first = Counter(s for s in transactions[0] if s.startswith("SELECT"))
    assert sum(first.values()) == 2
    for statements in transactions:
        each = Counter(statements)
        if store_url.startswith("postgresql"):
            # Both tables in one statement: a round trip (and GIL hand-backs) fewer.
            assert each["WITH log_chunks_written AS (INSERT"] == 1
            assert not [
                s for s in statements if s.startswith(("INSERT INTO log", "INSERT INTO roll"))
            ]
        else:
            assert each["INSERT INTO log_chunks (stream_id,"] == 1
            assert each["INSERT INTO rollups (stream_id,"] == 1
    rest = [s for t in transactions[1:] for s in t]
    assert not [s for s in rest if "streams" in s or "epochs" in s]


def test_a_write_of_one_statement_is_sent_without_begin_and_commit(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a statement outside a transaction commits by itself: around a write that
    is one statement (the log's, with its checkpoints), BEGIN and COMMIT would be two round
    trips more. Writes of several statements (a stream's first, a dictionary's, a reset's),
    and every write on SQLite, keep their transaction."""
    engine = open_store(store_url)
    autocommit: list[bool] = []
    sent: list[bool] = []

    def executed(conn: Any, *_: Any) -> None:
        if engine.dialect.name == "postgresql":
            sent.append(conn.connection.dbapi_connection.autocommit)

    event.listen(engine, "before_cursor_execute", executed)
    transactions = _write_inline(engine, 200, monkeypatch, autocommit)
    event.remove(engine, "before_cursor_execute", executed)
    assert len(autocommit) == len(transactions) > 10
    with engine.connect() as conn:
        checkpoints = conn.execute(select(func.count()).select_from(schema.checkpoints)).scalar()
    assert checkpoints
    if store_url.startswith("sqlite"):
        assert not any(autocommit)
        return
    # The driver's own state, statement by statement, as the writer asked.
    assert sent == [a for a, t in zip(autocommit, transactions, strict=True) for _ in t]
    assert not autocommit[0]  # the stream's first rows: its id looked up, its epoch written
    several = [a for a, t in zip(autocommit, transactions, strict=True) if len(t) > 1]
    assert several and not any(several)
    one = [a for a, t in zip(autocommit[1:], transactions[1:], strict=True) if len(t) == 1]
    assert len(one) > len(transactions) // 2 and all(one)
    # Checkpoints ride in the log's statement.
    assert not [s for t in transactions for s in t if "checkpoints" in s]


def test_only_postgresql_writes_the_log_of_known_streams_in_one_statement() -> None:
    known, new = StreamId("known", 0), StreamId("new", 0)
    writer = RowWriter(None, fence=Fence("m"))
    writer._stream_ids[known] = 1
    rollup = RollupRow(known, 0, "GPU", 0, 1, 1, 0, 1, 0, 0, 0)
    assert writer.one_statement(Prepared(rollups=[rollup]), "postgresql")
    assert not writer.one_statement(Prepared(rollups=[rollup]), "sqlite")
    other = RollupRow(new, 0, "GPU", 0, 1, 1, 0, 1, 0, 0, 0)
    assert not writer.one_statement(Prepared(rollups=[rollup, other]), "postgresql")


def test_a_resets_recovery_rows_in_one_transaction_are_written_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch, new_pg_database: Any
) -> None:
    """A recovery row holds all its reset's points so far: the rows before it in the same
    transaction need no statements of their own, and its points go in one statement. The
    store ends as with each row written."""
    engine = open_store(store_url)
    transactions = _write_inline(engine, 100_000, monkeypatch)
    assert len(transactions) <= 2
    recovered = Counter(s for t in transactions for s in t)
    inserts = recovered["INSERT INTO resets (stream_id,"]
    if store_url.startswith("sqlite"):
        # Each upsert runs again with its row left out: SQLite lets go of the map's copy
        # (storage/bulk_sql.py's `upsert_released`).
        assert inserts % 2 == 0
        inserts //= 2
    resets = inserts
    assert resets >= 3
    if store_url.startswith("postgresql"):
        # The figures and the points in one statement: a round trip fewer.
        assert recovered["WITH reset_recovery_written AS (INSERT"] == resets
        assert not [
            s for s in recovered if s.startswith(("UPDATE resets SET t50", "INSERT INTO reset_r"))
        ]
    else:
        assert recovered["UPDATE resets SET t50_s=?,"] == resets
        assert recovered["INSERT INTO reset_recovery (reset_id,"] == resets

    # The same rows, a few to a transaction: each recovery row written as it comes.
    if store_url.startswith("sqlite"):
        small_url = store_url.replace("kvscope.sqlite", "small.sqlite")
    else:
        small_url = new_pg_database()
    small = open_store(small_url)
    _write_inline(small, 20, monkeypatch)
    assert _recoveries(engine) == _recoveries(small)
    with engine.connect() as conn, small.connect() as other:
        query = text("SELECT * FROM reset_prefix_groups ORDER BY 1, 2, 3")
        assert conn.execute(query).all() == other.execute(query).all()
    engine.dispose()
    small.dispose()


@pytest.mark.parametrize("offsets", [(1, 2.5), (1.0, 2.5)])
def test_offsets_given_as_ints_and_floats_are_stored(
    store_url: str, offsets: tuple[float, ...]
) -> None:
    # The points go in one statement; on PostgreSQL as arrays, which psycopg refuses to make of
    # ints and floats mixed (found in review: the transaction failed).
    writer = StoreWriter(open_store(store_url), StoreSettings(recovery_offsets_s=offsets))
    ingest = StreamIngest(StreamId("r", 0), can_replay=False, sink=writer)
    batches = [
        (100.0, [store(1), store(2, parent=1)]),
        (101.0, [CLEAR]),
        (101.5, [store(1)]),
        (105.0, [store(2, parent=1)]),
    ]
    for seq, (ts, events) in enumerate(batches):
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()
    assert writer.failure is None
    with writer.engine.connect() as conn:
        rr = schema.reset_recovery
        stored = conn.execute(select(rr.c.offset_s).order_by(rr.c.offset_s)).scalars().all()
    assert stored == [1.0, 2.5]


def _read_backs(transactions: list[list[str]]) -> tuple[int, int]:
    """The transactions that read a recovery's completeness or offsets back from the store."""
    complete = sum(
        any(s.startswith("SELECT resets.recovery_complete") for s in t) for t in transactions
    )
    offsets = sum(
        any(s.startswith("SELECT reset_recovery.offset_s") for s in t) for t in transactions
    )
    return complete, offsets


def test_a_recovery_written_here_is_not_read_back(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a transaction wrote of a recovery (its completeness, its offsets) is passed to the
    prefix groups, not read back: its offsets only the first time this writer follows the
    reset (points may be stored from before it, e.g. a collector that ran with other offsets)."""
    engine = open_store(store_url)
    transactions = _write_inline(engine, 20, monkeypatch)
    recovering = sum(any("reset_recovery" in s for s in t) for t in transactions)
    with engine.connect() as conn:
        resets = conn.execute(select(schema.resets.c.id)).scalars().all()
    assert recovering > len(resets) >= 3
    complete, offsets = _read_backs(transactions)
    assert complete == 0
    assert offsets <= len(resets)
    engine.dispose()


def test_groups_follow_the_offsets_stored_not_only_those_written(store_url: str) -> None:
    """A writer that never followed the reset, given recovery rows with fewer points than the
    store holds (a collector restarted with other offsets): the answers are as of the offsets
    stored, in every transaction."""
    engine = open_store(store_url)
    first = StoreWriter(engine, StoreSettings())
    ingest = StreamIngest(STREAM, can_replay=False, sink=first)
    for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    first.close()
    assert first.failure is None
    r, rr = schema.resets, schema.reset_recovery
    with engine.connect() as conn:
        reset = conn.execute(select(r).order_by(r.c.id)).first()
        assert reset is not None
        stored = conn.execute(
            select(rr).where(rr.c.reset_id == reset.id).order_by(rr.c.offset_s)
        ).all()
    assert len(stored) >= 2
    points = tuple(
        RecoveryPoint(
            p.offset_s, p.blocks, p.hittable, p.orphans, p.share_blocks_back, p.share_tokens_back
        )
        for p in stored[:1]
    )
    answers: list[tuple[tuple[float, ...], bool]] = []
    second = RowWriter(None)
    second.followers.observe = lambda conn, found: answers.append((found.offsets, found.complete))
    for complete in (False, True):
        row = RecoveryRow(
            STREAM,
            (reset.epoch, reset.seq, reset.reason),
            points,
            reset.t50_s,
            reset.t90_s,
            reset.peak_orphans,
            reset.recovery_until_ts,
            complete,
        )
        prepared = Prepared(ordered=[row])
        with engine.begin() as conn:
            second.write(conn, prepared)
        second.committed(prepared)
    offsets = tuple(float(p.offset_s) for p in stored)
    assert answers == [(offsets, False), (offsets, True)]
    engine.dispose()


def test_a_reset_id_given_again_drops_every_stream_s_kept_offsets() -> None:
    """SQLite may give a pruned reset's id to another stream's new reset: the offsets kept for
    the pruned one (under any stream) are then not that id's, and are read back again."""
    from kvscope.collector.types import StreamId
    from kvscope.storage.prefix_followers import PrefixFollowers

    followers = PrefixFollowers()
    a, b = StreamId("a", 0), StreamId("b", 0)
    kept = followers.offsets._reached
    kept[a] = (7, None, (1.0, 5.0))
    kept[b] = (8, None, (1.0,))
    followers.reset_written(7)  # b's new reset, under a's pruned reset's id
    assert a not in kept and b in kept
