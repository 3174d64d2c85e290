"""`kvscope dump` on stores with holes, and on stores it may only read."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.collector.capture import read_capture, write_capture
from tests.conftest import capture_path

MISSING = range(100, 120)
"""Batches the collector never received: an unrecoverable gap (the capture has no replay)."""


@pytest.fixture
def holed_store(tmp_path: Path) -> str:
    """A store of the recorded vLLM stream with batches 100..119 missing (degraded there)."""
    records = [
        r
        for r in read_capture(capture_path("lab_3rps_180s.msgpack.gz"))
        if r.seq not in MISSING and r.seq < 400
    ]
    capture = tmp_path / "holed.msgpack.gz"
    write_capture(capture, records)
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    result = CliRunner().invoke(app, ["replay", str(capture), "--replica", "lab", "--store", store])
    assert result.exit_code == 0, result.output
    return store


def dump(store: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["dump", "--store", store, "--replica", "lab", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_seq_inside_a_hole_is_unknown_not_an_earlier_map(holed_store: str) -> None:
    for args in (["--seq", "110"], ["--seq", "110", "--epoch", "0"]):
        code, out, err = dump(holed_store, *args)
        assert code != 0, args
        assert out == ""
        assert "110" in err and "not stored" in err
    code, out, _ = dump(holed_store, "--seq", "99", "--epoch", "0")
    assert code == 0 and out.count('"hash"') > 10


def test_after_the_hole_the_map_is_flagged_until_a_clear(holed_store: str) -> None:
    code, out, err = dump(holed_store, "--seq", "120")
    assert code == 0 and out.count('"hash"') > 0
    assert "incomplete" in err and "gap" in err


@pytest.fixture
def read_only(holed_store: str, tmp_path: Path) -> Iterator[str]:
    """A copy of the store (one file, as a backup leaves it) in a read-only folder: a read-only
    mount as root (file modes do not stop root), file modes otherwise."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    with (
        closing(sqlite3.connect(holed_store.removeprefix("sqlite:///"))) as source,
        closing(sqlite3.connect(folder / "store.sqlite")) as copy,
    ):
        source.backup(copy)
    assert [f.name for f in folder.iterdir()] == ["store.sqlite"]
    store = f"sqlite:///{folder / 'store.sqlite'}"
    if os.geteuid() == 0:
        mounted = subprocess.run(
            ["mount", "--bind", "-o", "ro", str(folder), str(folder)],
            capture_output=True,
            text=True,
        )
        if mounted.returncode != 0:
            pytest.fail(f"cannot mount {folder} read-only: {mounted.stderr.strip()}")
        try:
            yield store
        finally:
            # Lazily: this process may still hold the file open.
            subprocess.run(["umount", "--lazy", str(folder)], check=True)
        return
    modes = {f: f.stat().st_mode for f in [folder, *folder.iterdir()]}
    for f in modes:
        f.chmod(stat.S_IRUSR | (stat.S_IXUSR if f.is_dir() else 0))
    try:
        yield store
    finally:
        for f, mode in modes.items():
            f.chmod(mode)


def test_a_read_only_store_is_read_not_migrated(read_only: str) -> None:
    folder = Path(read_only.removeprefix("sqlite:///")).parent
    assert not os.access(folder, os.W_OK) or os.geteuid() == 0
    code, out, err = dump(read_only, "--seq", "99")
    assert code == 0, err
    assert out.count('"hash"') > 10
    listed = CliRunner().invoke(app, ["resets", "--store", read_only])
    assert listed.exit_code == 0, listed.output


def test_a_store_that_is_not_there_is_one_clear_line(tmp_path: Path) -> None:
    code, out, err = dump(f"sqlite:///{tmp_path / 'nothing.sqlite'}", "--seq", "1")
    assert code == 2 and out == ""
    assert "no store" in err and "Traceback" not in err
    assert not (tmp_path / "nothing.sqlite").exists()


def test_the_api_serves_a_read_only_store(read_only: str) -> None:
    from fastapi.testclient import TestClient

    from kvscope.api.app import create_app
    from kvscope.api.data import ApiData
    from kvscope.storage.engine import may_write, open_store

    assert not may_write(read_only) or os.geteuid() == 0
    engine = open_store(read_only, read_only=True)
    client = TestClient(create_app(ApiData(engine=engine)))
    replica = client.get("/replicas/lab")
    assert replica.status_code == 200, replica.text
    assert replica.json()["ranks"][0]["last_seq"] == 399
    assert client.get("/resets").status_code == 200


def test_resets_print_whole_cells_piped_and_json_for_scripts(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    capture = str(capture_path("lab_3rps_180s.msgpack.gz"))
    replayed = CliRunner().invoke(app, ["replay", capture, "--replica", "lab", "--store", store])
    assert replayed.exit_code == 0, replayed.output
    listed = CliRunner().invoke(app, ["resets", "--store", store])
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[1].split()[:4] == ["id", "time", "(UTC)", "replica"]
    assert len(lines) == 2 + 2 and "…" not in listed.stdout  # the two clears, cells whole
    as_json = CliRunner().invoke(app, ["resets", "--store", store, "--json"])
    rows = json.loads(as_json.stdout)["rows"]
    assert [r["reason"] for r in rows] == ["all_blocks_cleared"] * 2
    assert all(r["replica"] == "lab" and r["recovery"] for r in rows)
    assert lines[2].split()[6] == f"{rows[0]['before_blocks']}/{rows[0]['before_hittable']}"
    # The recording ends before either 300 s window: both are partial, and say so.
    assert [r["recovery_complete"] for r in rows] == [False, False]
    assert [r["offsets_reached"][-1] for r in rows] == [30.0, 30.0]
    assert all(line.endswith("partial to +30 s") for line in lines[2:])
