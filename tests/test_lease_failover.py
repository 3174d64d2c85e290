"""Three `kvscope collect --lease` processes on one PostgreSQL, a `kill -9` of one, and one
that joins.

Four lab replicas (vLLM's real Scheduler, KVCacheManager and ZmqEventPublisher with its replay
buffer, on CPU) are stepped by the test. The collectors share their streams by lease; the one
killed had its streams taken over by the others, resumed from the store and the publishers'
replay; the one that joins then took its share from the others. The stored maps, rebuilt at
each snapshot, are vLLM's hash for hash; every batch is stored exactly once; and each stream's
grants wrote one after another, never two at once.
Every wait is on a condition (the leases' TTL is the production default).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest
from sqlalchemy import func, select

from kvscope.collector.types import StreamId
from kvscope.lab.engine import TruthCounts
from kvscope.lab.ports import free_port
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.leases import leases, live_members, owner_of
from tests.test_crash_resume import collect_process, kill_if_running
from tests.vllm_source import ResetOdds, Source

pytestmark = pytest.mark.vllm
RESETS = ResetOdds(keep=0.02, preempt=0.01)
REPLICAS = 4
Snapshot = dict[StreamId, tuple[int, TruthCounts]]


def write_config(path: Path, sources: dict[StreamId, tuple[int, int]]) -> None:
    lines = []
    for stream, (port, replay) in sources.items():
        lines += [
            "[[replica]]",
            f'name = "{stream.replica}"',
            f'endpoint = "tcp://127.0.0.1:{port}"',
            f'replay = "tcp://127.0.0.1:{replay}"',
        ]
    path.write_text("\n".join(lines) + "\n")


def start_collect(config: Path, store: str, log: Path) -> subprocess.Popen[bytes]:
    return collect_process(["--config", str(config), "--store", store, "--lease"], log)


class Run:
    def __init__(self, store: str, sources: dict[StreamId, Source]) -> None:
        self.engine = open_store(store)
        self.sources = sources

    def step(self) -> None:
        for source in self.sources.values():
            source.step()

    def wait(self, cond: Callable[[], bool], what: str, stepping: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for _ in range(10):
                if stepping:
                    self.step()
                time.sleep(0.03)

    def balanced(self, members: set[str]) -> bool:
        """Every stream's lease held, by its rendezvous owner among exactly `members`."""
        with self.engine.connect() as conn:
            live = set(live_members(conn))
            held = leases(conn)
        return live == members and all(
            stream in held and held[stream].live and held[stream].owner == owner_of(stream, live)
            for stream in self.sources
        )

    def members(self) -> set[str]:
        with self.engine.connect() as conn:
            return set(live_members(conn))

    def stored_last_seq(self, stream: StreamId) -> int:
        c, s = schema.log_chunks, schema.streams
        with self.engine.connect() as conn:
            value = conn.execute(
                select(func.max(c.c.last_seq))
                .join(s, s.c.id == c.c.stream_id)
                .where(s.c.replica == stream.replica, s.c.rank == stream.rank)
            ).scalar()
        return -1 if value is None else int(value)

    def snapshot(self) -> Snapshot:
        """The engines paused; once the store holds every last batch, vLLM's truth there."""
        want = {stream: source.last_seq for stream, source in self.sources.items()}
        self.wait(
            lambda: all(self.stored_last_seq(s) == seq for s, seq in want.items()),
            f"the store to reach {want}",
            stepping=False,
            timeout=60,
        )
        return {
            stream: (self.stored_last_seq(stream), source.truth_counts())
            for stream, source in self.sources.items()
        }


def pid_of(member: str) -> int:
    return int(member.split("/")[1])  # storage/lease_keeper.member_id: host/pid/nonce


def test_three_collectors_survive_a_kill_9_of_one(
    stack: ExitStack, tmp_path: Path, pg_url: str
) -> None:
    ports = {StreamId(f"r{i}", 0): (free_port(), free_port()) for i in range(REPLICAS)}
    sources = {}
    for i, (stream, (port, replay)) in enumerate(ports.items()):
        sources[stream] = Source.start(96, port, replay, seed=30 + i, resets=RESETS)
        stack.callback(sources[stream].close)
    config = tmp_path / "kvscope.toml"
    write_config(config, ports)
    log = tmp_path / "collect.log"
    run = Run(pg_url, sources)
    collectors = []
    for _ in range(3):
        collectors.append(start_collect(config, pg_url, log))
        stack.callback(kill_if_running, collectors[-1])

    def check_alive() -> None:
        for process in collectors:
            assert process.poll() is None or process.returncode == -signal.SIGKILL, log.read_text()[
                -4000:
            ]

    # The three share the streams (each joined and took its share from whoever held it).
    run.wait(lambda: len(run.members()) == 3, "three members", stepping=True, timeout=60)
    three = run.members()
    run.wait(lambda: run.balanced(three), "a balanced share", stepping=True, timeout=60)
    check_alive()
    snapshots = [run.snapshot()]

    # kill -9 of the collector that holds the most streams; the engines go on meanwhile.
    with run.engine.connect() as conn:
        owners = [lease.owner for lease in leases(conn).values()]
    victim = max(three, key=owners.count)
    os.kill(pid_of(victim), signal.SIGKILL)
    with log.open("a") as note:  # for a reader of the log: the takeovers' delay
        note.write(f"test: kill -9 of {victim} at {time.time():.3f}\n")
    survivors = three - {victim}
    for _ in range(50):
        run.step()
    run.wait(lambda: run.balanced(survivors), "the takeover", stepping=True, timeout=60)
    check_alive()
    snapshots.append(run.snapshot())

    # A collector that joins takes its share: the others give it up (flushed, released).
    collectors.append(start_collect(config, pg_url, log))
    stack.callback(kill_if_running, collectors[-1])
    run.wait(lambda: len(run.members()) == 3, "the new member", stepping=True, timeout=60)
    joined = run.members()
    run.wait(lambda: run.balanced(joined), "the new share", stepping=True, timeout=60)
    (new,) = joined - survivors
    moved = {s for s in sources if owner_of(s, joined) == new}  # often some (tests/
    # test_lease_keeper.py gives streams up deterministically)
    check_alive()
    for _ in range(100):
        run.step()
        time.sleep(0.005)
    snapshots.append(run.snapshot())

    for process in collectors:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()[-4000:]

    g = schema.lease_grants
    with run.engine.connect() as conn:
        for snapshot in snapshots:
            for stream, (seq, truth) in snapshot.items():
                sid = stream_id(conn, stream.replica, stream.rank)
                rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), stream)
                assert rebuilt.map.counts() == truth, (stream, seq)
                assert rebuilt.unknown_because == [], (stream, seq)
        for stream, source in sources.items():
            sid = stream_id(conn, stream.replica, stream.rank)
            # Every batch exactly once: none lost at the kill, none written twice.
            assert batch_log.count_batches(conn, sid) == source.batches, stream
            grants = conn.execute(
                select(g)
                .where(g.c.replica == stream.replica, g.c.rank == stream.rank)
                .order_by(g.c.token)
            ).all()
            assert [r.token for r in grants] == list(range(1, len(grants) + 1))
            for before, after in zip(grants, grants[1:], strict=False):
                # One writer at a time: a grant's writes all landed before the next grant.
                assert before.last_write_at is None or before.last_write_at < after.granted_at
                assert after.takeover == (before.owner == victim and before.released_at is None)
            for grant in grants:
                assert grant.first_write_at is None or grant.first_write_at >= grant.granted_at
        taken = conn.execute(select(func.count()).select_from(g).where(g.c.takeover)).scalar()
    assert owners.count(victim) >= 1 and taken == owners.count(victim)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "taken over" in text and "resumed from the store" in text
    if moved:  # given up to the new member: written, then released
        assert re.search(r": lease \d+ released$", text, re.MULTILINE), text[-4000:]
