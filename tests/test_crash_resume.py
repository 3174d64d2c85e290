"""kill -9 of a storing collector, then a restart: it ends with vLLM's exact map.

vLLM's real KVCacheManager and ZmqEventPublisher (with its replay buffer) keep publishing while
`kvscope collect` is dead; the restarted process rebuilds its map from the store (checkpoint plus
log) and asks the replay socket for everything after the last stored batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from kvscope.collector.snapshot import decode_tables
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from kvscope.lab.ports import free_port
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import Position, position_at_seq, rebuild, stream_id
from kvscope.storage.recovery import DEFAULT_OFFSETS_S, RecoveryPoint, RecoveryTracker
from tests.vllm_source import ResetOdds, Source

pytestmark = pytest.mark.vllm
RESETS = ResetOdds(keep=0.02, preempt=0.01)
STREAM = StreamId("r", 0)


def collect_process(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`kvscope collect ARGS` (no live table, INFO log) as a process of its own, logging to
    `log`: a process the tests can kill -9."""
    command = [sys.executable, "-m", "kvscope.cli", "--log-level", "INFO", "collect", "--no-live"]
    return subprocess.Popen([*command, *args], stdout=log.open("ab"), stderr=subprocess.STDOUT)


def start_collect(store: str, port: int, replay_port: int, log: Path) -> subprocess.Popen[bytes]:
    endpoints = [
        "--replica",
        f"r=tcp://127.0.0.1:{port}",
        "--replay",
        f"tcp://127.0.0.1:{replay_port}",
    ]
    return collect_process([*endpoints, "--store", store], log)


def kill_if_running(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()


def stored_last_seq(store: str) -> int | None:
    with open_store(store).connect() as conn:
        value = conn.execute(select(func.max(schema.log_chunks.c.last_seq))).scalar()
        return None if value is None else int(value)


def wait_until(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def recovery_from_the_log(
    conn: Any, sid: int, reset: Any, next_seq: int | None
) -> tuple[list[RecoveryPoint], float | None, float | None]:
    """A clear's recovery recomputed from the stored log, as an uninterrupted writer follows
    it: the map before each later batch (points), then after it (t50, t90), until the next
    clear's batch."""
    tables, _ = decode_tables(reset.before)
    tracker = RecoveryTracker.start(reset.ts, tables, DEFAULT_OFFSETS_S)
    view = rebuild(conn, Position(sid, reset.epoch, reset.seq, reset.ts), STREAM).map
    decoder = BatchDecoder()
    for batch in batch_log.batches_between(conn, sid, reset.epoch, reset.seq, 2**62):
        tracker.before_batch(view, batch.ts)
        if batch.seq == next_seq:
            break
        view.apply(decoder.decode(batch.payload, batch.seq), reset.epoch)
        tracker.after_batch(view, batch.ts)
        if tracker.done:
            break
    return tracker.points, tracker.t50_s, tracker.t90_s


def test_kill_9_then_restart_ends_with_the_exact_map(stack: ExitStack, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    log = tmp_path / "collect.log"
    port, replay_port = free_port(), free_port()
    source = Source.start(96, port, replay_port, seed=5, resets=RESETS)
    stack.callback(source.close)

    first = start_collect(store, port, replay_port, log)
    stack.callback(kill_if_running, first)
    time.sleep(3)  # interpreter start and connect; what it misses comes back by replay
    for _ in range(200):
        source.step()
        time.sleep(0.002)
    wait_until(
        lambda: first.poll() is not None or (stored_last_seq(store) or 0) > 50,
        30,
        "the first collector to store",
    )
    assert first.poll() is None, log.read_text()[-3000:]
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    at_kill = stored_last_seq(store)

    # The engine goes on while nobody listens.
    for _ in range(200):
        source.step()
    assert source.last_seq is not None and at_kill is not None and source.last_seq > at_kill + 20

    second = start_collect(store, port, replay_port, log)
    stack.callback(kill_if_running, second)
    for _ in range(50):
        source.step()
        time.sleep(0.01)
    last = source.last_seq
    wait_until(lambda: stored_last_seq(store) == last, 60, f"the store to reach seq {last}")
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0, log.read_text()[-3000:]

    with open_store(store).connect() as conn:
        sid = stream_id(conn, "r")
        rebuilt = rebuild(conn, position_at_seq(conn, sid, last), StreamId("r", 0))
        assert rebuilt.map.counts() == source.truth_counts()
        assert rebuilt.unknown_because == []
        stored = batch_log.count_batches(conn, epoch=0)
        assert stored == source.batches  # every batch exactly once: none lost, none twice
        # Every clear's recovery is what an uninterrupted run stores, the one open at the kill
        # included: its tracker was rebuilt at the restart and followed on.
        r, rr = schema.resets, schema.reset_recovery
        resets = conn.execute(select(r).order_by(r.c.seq)).all()
        assert resets and all(x.reason == "all_blocks_cleared" for x in resets)
        assert any(x.seq <= at_kill for x in resets)
        for reset, after in zip(resets, [*(x.seq for x in resets[1:]), None], strict=True):
            points = conn.execute(
                select(rr).where(rr.c.reset_id == reset.id).order_by(rr.c.offset_s)
            ).all()
            expected, t50, t90 = recovery_from_the_log(conn, sid, reset, after)
            assert [RecoveryPoint(*p[1:]) for p in points] == expected, reset.seq
            assert (reset.t50_s, reset.t90_s) == (t50, t90), reset.seq
    assert "resumed from the store" in log.read_text()
