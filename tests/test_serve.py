"""`kvscope serve` as an operator runs it: a process, a replica, the API, then SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import read_capture
from kvscope.demo_sources import bundled
from kvscope.lab.ports import free_port


def test_serve_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    records = list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))
    source = CaptureSource(records)
    port = free_port()
    log = tmp_path / "serve.log"
    command = [
        sys.executable,
        "-m",
        "kvscope.cli",
        "serve",
        "--replica",
        f"lab={source.endpoint}",
        "--replay",
        source.replay_endpoint,
        "--store",
        f"sqlite:///{tmp_path / 's.sqlite'}",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        source.play()
        last = records[-1].seq
        while time.monotonic() < deadline:
            rank = httpx.get(url + "/replicas/lab", timeout=5).json()["ranks"][0]
            if rank["last_seq"] == last:
                break
            time.sleep(0.2)
        assert rank["last_seq"] == last and rank["degraded"] is None and rank["connected"]
        assert httpx.get(url + "/docs", timeout=5).status_code == 200
        # The store's writer is a thread of its own: the resets land a moment after the map.
        while len(resets := httpx.get(url + "/resets", timeout=5).json()) < 2:
            assert time.monotonic() < deadline, resets
            time.sleep(0.1)
        assert len(resets) == 2  # preempt and keep
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        source.close()
    assert code == 0, log.read_text()[-2000:]


def test_serve_with_leases_is_not_ready_before_its_first_lease_round(
    tmp_path: Path, pg_url: str
) -> None:
    """`serve --lease` answers /readyz 503 until it knows which streams it holds: with a turn
    of a minute, for the whole first minute."""
    port = free_port()
    log = tmp_path / "serve.log"
    command = [
        *[sys.executable, "-m", "kvscope.cli", "serve", "--lease", "--store", pg_url],
        *["--replica", f"lab=tcp://127.0.0.1:{free_port()}", "--port", str(port)],
        *["--lease-ttl", "120", "--lease-renew", "60"],
    ]
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "serve to answer"
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        error = ready.json()["error"]
        assert (ready.status_code, error["code"]) == (503, "leases_settling")
        assert "first lease round" in error["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()[-2000:]
