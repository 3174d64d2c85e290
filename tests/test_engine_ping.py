"""A PostgreSQL engine pings a pooled connection only after it sat idle (storage/engine.py):
the writer's transactions follow one another without a round trip each for the ping, and a
connection that died is still replaced (idle) or its transaction retried (in use)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log
from kvscope.storage import engine as engine_module
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import frames, payload, store


def _pings(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pinged: list[int] = []
    ping = engine.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pinged.append(1)
        return bool(ping(dbapi_connection))

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    return pinged


def _kill_connections(url: str) -> int:
    """Ends every other session on `url`'s database (a private one): what a server restart
    does to the pool's connections."""
    admin = create_engine(url, poolclass=NullPool)
    with admin.connect() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    admin.dispose()
    return int(killed)


def test_connections_in_use_are_not_pinged(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = open_store(pg_url)
    pinged = _pings(engine, monkeypatch)
    for _ in range(3):
        with engine.begin() as conn:
            conn.execute(select(1))
    assert not pinged
    engine.dispose()


def test_an_idle_dead_connection_is_pinged_and_replaced(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_store(pg_url)
    pinged = _pings(engine, monkeypatch)
    with engine.begin() as conn:
        before = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    assert _kill_connections(pg_url) == 1
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.0)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != before
    assert pinged
    engine.dispose()


def test_the_writer_retries_on_a_connection_that_died(pg_url: str) -> None:
    writer = StoreWriter(open_store(pg_url))
    stream = StreamId("dead", 0)
    ingest = StreamIngest(stream, can_replay=False, sink=writer)
    for seq in range(20):
        ingest.live_frames(frames(seq, payload(store(seq + 1), ts=100.0 + seq)), 100.0 + seq)
        if seq == 9:
            assert writer.flush(30)
            assert _kill_connections(pg_url) >= 1
    assert writer.flush(60)
    writer.close()
    assert writer.failure is None and writer.stats.retries >= 1
    with writer.engine.connect() as conn:
        assert batch_log.count_batches(conn) == 20
        assert conn.execute(select(func.count()).select_from(text("epochs"))).scalar_one() == 1
    writer.engine.dispose()


def test_a_read_after_the_server_dropped_a_recently_used_connection_is_answered(
    pg_url: str,
) -> None:
    """The API reads between the writer's transactions, on its engine (`kvscope api`'s, or in
    `serve` the writer's): a server restart must not turn its next request into a 503. The
    connection's first statement after the restart fails as a disconnection (no ping for a
    connection used within PING_AFTER_IDLE_S); a read is answered on a new one."""
    from fastapi.testclient import TestClient

    from kvscope.api.app import create_app
    from kvscope.api.data import ApiData

    open_store(pg_url).dispose()
    engine = open_store(pg_url, read_only=True)
    client = TestClient(create_app(ApiData(engine=engine)))
    try:
        assert client.get("/resets").status_code == 200
        assert _kill_connections(pg_url) == 1
        response = client.get("/resets")
        assert response.status_code == 200, response.text
        assert response.json() == []
    finally:
        engine.dispose()
