"""Two `kvscope collect` processes writing one PostgreSQL at once, each owning its replicas."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select
from typer.testing import CliRunner

from kvscope.capture_source import CaptureSource
from kvscope.cli import app
from kvscope.collector.capture import read_capture
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from tests.conftest import capture_path

CAPTURES = {"a": "lab_3rps_180s", "b": "lab_10rps_300s"}


def collect(store: str, shard: str, source: CaptureSource, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "kvscope.cli",
        "collect",
        "--no-live",
        "--store",
        store,
        "--shard",
        shard,
        "--replica",
        f"{shard}={source.endpoint}",
        "--replay",
        source.replay_endpoint,
    ]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stored_last(store: str, replica: str) -> int | None:
    with open_store(store).connect() as conn:
        b, s = schema.log_chunks, schema.streams
        value = conn.execute(
            select(func.max(b.c.last_seq))
            .join(s, s.c.id == b.c.stream_id)
            .where(s.c.replica == replica)
        ).scalar()
    return None if value is None else int(value)


def connected(store: str, replica: str) -> bool:
    """Whether the replica's collector has stored a connected stretch (its socket is up)."""
    with open_store(store).connect() as conn:
        i, s = schema.intervals, schema.streams
        found = conn.execute(
            select(i.c.id)
            .join(s, s.c.id == i.c.stream_id)
            .where((s.c.replica == replica) & (i.c.kind == "connected"))
            .limit(1)
        ).first()
    return found is not None


def wait_until(
    done: Callable[[], bool], procs: dict[str, subprocess.Popen[bytes]], logs: Path
) -> None:
    """Poll `done` while every collector runs, up to two minutes."""
    deadline = time.monotonic() + 120
    while not done():
        for shard, proc in procs.items():
            assert proc.poll() is None, (logs / f"{shard}.log").read_text()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_two_collectors_share_one_postgres(pg_url: str, tmp_path: Path) -> None:
    open_store(pg_url)  # migrate once, before two processes race to
    sources, procs, truth = {}, {}, {}
    try:
        for shard, name in CAPTURES.items():
            capture = capture_path(f"{name}.msgpack.gz")
            sidecar = json.loads(capture.with_name(f"{name}.json").read_text())
            last = max(
                (s for s in sidecar["snapshots"] if s["pending_events"] == 0),
                key=lambda s: s["published_through_seq"],
            )
            truth[shard] = (last["published_through_seq"], last["hashes"])
            sources[shard] = CaptureSource(list(read_capture(capture)), speed=200.0)
            procs[shard] = collect(pg_url, shard, sources[shard], tmp_path / f"{shard}.log")
        # Both sockets up before playing, so each collector hears its stream from the start.
        wait_until(lambda: all(connected(pg_url, shard) for shard in procs), procs, tmp_path)
        for source in sources.values():
            source.play()
        want = {shard: source.records[-1].seq for shard, source in sources.items()}
        wait_until(
            lambda: all(stored_last(pg_url, s) == w for s, w in want.items()), procs, tmp_path
        )
        # A third collector may not take over a replica another shard writes.
        refused = CliRunner().invoke(
            app,
            [
                "collect",
                "--store",
                pg_url,
                "--shard",
                "c",
                "--replica",
                "a=tcp://127.0.0.1:9",
                "--duration",
                "0",
            ],
        )
        assert refused.exit_code == 2 and "written by shard 'a'" in refused.output
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(30) for proc in procs.values()]
        for source in sources.values():
            source.close()
    assert codes == [0, 0]

    with open_store(pg_url).connect() as conn:
        shards = dict(conn.execute(select(schema.streams.c.replica, schema.streams.c.shard)).all())
        assert shards == {"a": "a", "b": "b"}
        for shard, (seq, hashes) in truth.items():
            sid = stream_id(conn, shard)
            rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), StreamId(shard, 0))
            assert rebuilt.map.counts() == {(h, g): n for h, g, n in hashes}
            stored = batch_log.count_batches(conn, sid)
            assert stored == len(sources[shard].records)
