from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

REPO = Path(__file__).resolve().parents[1]

# vLLM on CPU and offline, before any test module imports it (as scripts/test.sh sets them).
for _name, _value in (
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
):
    os.environ.setdefault(_name, _value)

# Hypothesis keeps nothing in the checkout (.hypothesis/: examples, constants): no test writes
# there.
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="kvscope-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
settings.register_profile("kvscope", database=None)
settings.load_profile("kvscope")

# Its asserts are the migration tests' own: pytest shows what they compared, as in a test file.
pytest.register_assert_rewrite("tests.migration_support")

TEST_DATA = Path(__file__).resolve().parent / "data"
BUNDLED_DATA = REPO / "kvscope" / "data"


def capture_path(name: str) -> Path:
    """A recorded vLLM stream (or its sidecar) kept in the repository: tests/data, or the one
    the package bundles for the demo (kvscope/data). Format: kvscope/data/FORMAT.md."""
    for folder in (TEST_DATA, BUNDLED_DATA):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"no capture {name} in {TEST_DATA} or {BUNDLED_DATA}")


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


@pytest.fixture(scope="module")
def lab_demo_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real `kvscope demo --source lab` run per test module (tests/mode_compare_support.py)."""
    from tests.mode_compare_support import demo_lab_store

    engine = demo_lab_store(tmp_path_factory)
    yield engine
    engine.dispose()


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Publishers, forwarders, collectors and processes registered here are shut down after the
    test, last registered first."""
    with ExitStack() as exit_stack:
        yield exit_stack


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
    return found.stamp.recv_ts


# --- the suite's own rules: nothing skipped, nothing written into the checkout ----------------
# Files the tooling writes (bytecode, the compiled extensions, the type checker's tree).
_BEFORE = pytest.StashKey[set[str] | None]()
_TOOLING = ("__pycache__/", ".venv/", ".build/", ".mypy_cache/", ".ruff_cache/", "build/")


def _checkout_files() -> set[str] | None:
    """Every untracked or changed path of the checkout, ignored ones included; None outside git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--ignored", "--untracked-files=all"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    paths = {line[3:] for line in out.splitlines()}
    return {p for p in paths if not any(part in p for part in _TOOLING) and not p.endswith(".so")}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _checkout_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HYPOTHESIS_HOME, ignore_errors=True)
    problems = []
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        problems.append(f"{len(skipped)} tests skipped: every test must run (scripts/dev-setup.sh)")
    before = session.config.stash.get(_BEFORE, None)
    after = _checkout_files() if before is not None else None
    if before is not None and after is not None and after - before:
        problems.append(f"tests wrote into the checkout: {sorted(after - before)[:10]}")
    if problems and session.exitstatus == 0:
        for problem in problems:
            print(f"\nkvscope test rules: {problem}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
