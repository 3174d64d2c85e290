"""A commit that lands but is reported as failed (the connection dropped before the answer) is
retried by the writer: the store must end up the same, with nothing written twice.

The lost answer is simulated (a real server cannot be made to drop exactly that packet here):
the engine's transaction commits for real on the real SQLite file or PostgreSQL, then raises
the error a dropped connection raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import OperationalError

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)


class AnswerLostAfterCommit:
    """An engine whose every `every`-th write commits and then reports failure: a transaction
    (`begin`), or a statement sent outside one (`connect`, in autocommit: storage/autocommit.py)."""

    def __init__(self, engine: Engine, every: int) -> None:
        self.engine = engine
        self.every = every
        self.transactions = 0
        self.lost = 0

    def begin(self) -> AbstractContextManager[Connection]:
        return self.answer_lost(self.engine.begin())

    def connect(self) -> _Connecting:
        return _Connecting(self, self.engine.connect())

    @contextmanager
    def answer_lost(self, opened: AbstractContextManager[Connection]) -> Iterator[Connection]:
        with opened as conn:
            yield conn
        self.transactions += 1
        if self.transactions % self.every == 0:
            self.lost += 1
            raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class _Connecting:
    """`AnswerLostAfterCommit.connect`'s connection, its answer lost as it is closed."""

    def __init__(self, engine: AnswerLostAfterCommit, conn: Connection) -> None:
        self._conn = conn
        self._closing = engine.answer_lost(conn)

    def execution_options(self, **options: Any) -> _Connecting:
        self._conn.execution_options(**options)
        return self

    def __enter__(self) -> Connection:
        return self._closing.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        return self._closing.__exit__(*exc)


def test_a_commit_whose_answer_was_lost_is_retried_without_writing_twice(store_url: str) -> None:
    name = "lab_10rps_300s"
    capture = capture_path(f"{name}.msgpack.gz")
    sidecar = json.loads(capture.with_name(f"{name}.json").read_text())
    # Small transactions, so that every kind of row lands in one that is retried.
    settings = StoreSettings(
        rows_per_transaction=40, checkpoint_every_batches=300, retry_initial_s=0.001, linger_s=0
    )
    writer = StoreWriter(open_store(store_url), settings)
    flaky = AnswerLostAfterCommit(writer.engine, every=3)
    writer.engine = flaky  # type: ignore[assignment]
    samples: dict[int, dict[tuple[int, int], int]] = {}
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    records = list(read_capture(capture))
    for record in records:
        ingest.live_frames(record.frames, record.recv_ts)
        if record.seq % 500 == 0:
            samples[record.seq] = ingest.map.counts()
    writer.close(120)
    assert flaky.lost > 50 and writer.stats.retries == flaky.lost

    engine = open_store(store_url)
    with engine.connect() as conn:
        sid = stream_id(conn, "lab")
        assert batch_log.count_batches(conn, sid) == len(records)
        seqs = [b.batch.seq for b in batch_log.all_batches(conn, sid)]
        assert seqs == sorted(set(seqs))
        resets = conn.execute(select(schema.resets.c.seq).order_by(schema.resets.c.seq)).all()
        expected = [r["cleared_in_seq"] for r in sidecar["resets"] if r["result"]]
        assert [r.seq for r in resets] == expected
        assert conn.execute(select(func.count()).select_from(schema.reset_recovery)).scalar()
        for seq, live in samples.items():
            assert rebuild(conn, position_at_seq(conn, sid, seq), STREAM).map.counts() == live


class RefusesFirst:
    """An engine whose first transaction fails for good (not a store that is down): the
    writer finds the row at fault by writing them one by one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.refused = False

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        if not self.refused:
            self.refused = True
            raise ValueError("a value the store cannot hold")
        with self.engine.begin() as conn:
            yield conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_rows_written_one_by_one_store_each_batch_once(tmp_path: Path) -> None:
    """A transaction retried row by row stores each batch once, not the chunks of the failed
    attempt too."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    writer = StoreWriter(open_store(url), StoreSettings(linger_s=60))
    writer.engine = RefusesFirst(writer.engine)  # type: ignore[assignment]  # duck-typed stand-in
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in list(read_capture(capture_path("lab_10rps_300s.msgpack.gz")))[:200]:
        ingest.live_frames(record.frames, record.recv_ts)
    assert writer.flush(60)  # one transaction of them all, refused, then one per row
    with open_store(url).connect() as conn:
        c = schema.log_chunks
        batches = conn.execute(select(func.sum(c.c.batches))).scalar_one()
    assert batches == 200 and writer.stats.rows_refused == 0
    writer.close()
