from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
def pg_url() -> Iterator[str]:
    """A fresh database on the real PostgreSQL server, dropped afterwards."""
    import uuid

    from sqlalchemy import create_engine, text

    name = f"kvscope_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs on a real SQLite file and on the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kvscope.sqlite'}"
    return str(request.getfixturevalue("pg_url"))
