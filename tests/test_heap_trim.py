"""Once a backlog has drained, the writer hands the freed heap back to the OS.

CPython frees a drained queue's payloads to the C allocator, which keeps their pages: after an
outage or a burst `kvscope serve` stayed hundreds of MiB larger than before although nothing
was held (benchmarks/hostile.py). The writer now asks glibc to return its free pages
(`malloc_trim`) once the queue that held past `trim_after_bytes` is nearly empty again; a writer
that never held that much never trims."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.heap_trim import rss_bytes, trim_heap
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)


def _run(tmp_path: Path, trim_after_bytes: int, locked: bool) -> StoreWriter:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    settings = StoreSettings(
        queue_rows=1_000_000, trim_after_bytes=trim_after_bytes, linger_s=0, retry_max_s=0.05
    )
    writer = StoreWriter(open_store(url), settings)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    lock = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)
    if locked:  # the store is down while the whole recording arrives: a backlog
        lock.execute("BEGIN EXCLUSIVE")
    try:
        for record in read_capture(capture_path("lab_10rps_300s.msgpack.gz")):
            ingest.live_frames(record.frames, record.recv_ts)
        if locked:
            assert writer.memory_bytes > trim_after_bytes
    finally:
        if locked:
            lock.rollback()
        lock.close()
    assert writer.flush(60)
    writer.close(60)
    return writer


def test_a_drained_backlog_is_trimmed_once(tmp_path: Path) -> None:
    writer = _run(tmp_path, trim_after_bytes=1 << 20, locked=True)
    assert writer.stats.heap_trims == 1


def test_a_writer_that_kept_up_never_trims(tmp_path: Path) -> None:
    writer = _run(tmp_path, trim_after_bytes=1 << 30, locked=False)
    assert writer.stats.heap_trims == 0


def test_trim_heap_runs_here_and_rss_is_read() -> None:
    """This machine is glibc Linux: the call is made (elsewhere it is skipped, said by False)."""
    assert trim_heap() is True
    rss = rss_bytes()
    assert rss is not None and rss > 10 << 20


_FREED_IN_A_THREAD = """
import sys, threading
from kvscope.storage.heap_trim import pin_thresholds, rss_bytes
if sys.argv[1] == "pin":
    assert pin_thresholds()
big = b"x" * (8 << 20)  # mapped apart; freeing it raises glibc's thresholds unless pinned
del big
out = []
def run():
    held = b"y" * (6 << 20)  # in the thread's own arena once the thresholds rose
    before = rss_bytes()
    del held
    out.append(before - rss_bytes())
t = threading.Thread(target=run)
t.start(); t.join()
print(out[0])
"""


@pytest.mark.skipif(not trim_heap(), reason="glibc's malloc only")
def test_a_large_block_freed_by_the_writer_thread_goes_back_to_the_os() -> None:
    """glibc raises its mmap and trim thresholds after a large free, so a thread's later large
    blocks land at its arena's top and stay there once freed (malloc_trim leaves a thread
    arena's top alone): the writer pins them."""
    out = subprocess.run(
        [sys.executable, "-c", _FREED_IN_A_THREAD, "pin"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert int(out) >= 5 << 20


def test_a_store_writer_pins_the_thresholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvscope.storage.writer as writer_module

    calls: list[bool] = []

    def pin() -> bool:
        calls.append(True)
        return True

    monkeypatch.setattr(writer_module, "pin_thresholds", pin)
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    writer.close(10)
    assert calls == [True]
