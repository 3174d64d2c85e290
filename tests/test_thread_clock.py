"""benchmarks/_thread_clock.py: a thread's time on a core, waiting for one, and blocked, as
Linux counts it per thread: what benchmarks/store.py splits a store run's wall into."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _thread_clock import ThreadClock, thread_clock


def _clock_of(tid: int) -> ThreadClock:
    clock = thread_clock(tid)
    assert clock is not None
    return clock


def test_a_thread_s_sleeps_count_as_blocked_not_as_cpu() -> None:
    tid: list[int] = []
    go, went = threading.Event(), threading.Event()

    def sleeper() -> None:
        tid.append(threading.get_native_id())
        go.wait()
        for _ in range(20):
            time.sleep(0.002)
        went.set()
        time.sleep(1)  # still alive while it is read

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    while not tid:
        time.sleep(0.001)
    before = _clock_of(tid[0])
    go.set()
    went.wait()
    after = _clock_of(tid[0])
    assert after.waits - before.waits >= 20
    assert after.cpu - before.cpu < 20 * 0.002  # less than it slept: sleeps are not CPU
    assert after.run_queue >= before.run_queue >= 0


def test_the_calling_thread_s_work_counts_as_cpu() -> None:
    tid = threading.get_native_id()
    before = _clock_of(tid)
    started = time.thread_time()
    while time.thread_time() - started < 0.05:
        pass
    after = _clock_of(tid)
    assert after.cpu - before.cpu >= 0.04


def test_a_thread_not_of_this_process_has_no_clock() -> None:
    assert thread_clock(0) is None


def test_a_split_says_what_the_wall_was_beside_cpu() -> None:
    spent = ThreadClock(cpu=0.5, run_queue=1.5, waits=30) - ThreadClock(0.25, 0.5, 10)
    assert spent == ThreadClock(0.25, 1.0, 20)
    assert spent.blocked(wall=1.5) == pytest.approx(0.25)
