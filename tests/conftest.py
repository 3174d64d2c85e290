from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SHARED_CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"


def shared_capture(name: str) -> Path:
    """A capture from shared/captures beside the checkout; CI always has it, so never skip there."""
    path = SHARED_CAPTURES / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: CI must have shared/captures beside the checkout")
        pytest.skip(f"{path} not present (it lies beside the checkout in CI)")
    return path


PG_ADMIN_URL = os.environ.get(
    "KVSCOPE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture
def new_pg_database() -> Iterator[Callable[[], str]]:
    """Makes fresh databases on the real PostgreSQL server; all are dropped afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    # No pooling: a test may restart the server under us.
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    made: list[str] = []

    def make() -> str:
        name = f"kvscope_test_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name

    yield make
    with admin.connect() as conn:
        for name in made:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def pg_url(new_pg_database: Callable[[], str]) -> str:
    """A fresh database on the real PostgreSQL server, dropped afterwards."""
    return new_pg_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs on a real SQLite file and on the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kvscope.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


def collector_time(conn: Any, engine_ts: float) -> float:
    """The collector's receive time of the last stored batch at or before `engine_ts`.

    Reset requests are recorded on the collector's clock and linked to clears by it; a
    recording's batch `ts` is on the engine's (simulated) clock.
    """
    from sqlalchemy import select

    from kvscope.storage import batch_log, schema

    sid = conn.execute(select(schema.streams.c.id)).scalar_one()  # the one replica
    found = batch_log.stamped_last_before(conn, sid, engine_ts)
    assert found is not None
    return found.batch.recv_ts
