"""`kvscope serve` with a `[fleet]`: a lab replica that connects is listed, goes, is kept in
the store, and a restarted kvscope takes it up where the store left it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from kvscope.cli import app
from kvscope.lab.ports import free_port
from kvscope.lab.replica import LabReplica
from kvscope.lab.settings import EngineSettings
from kvscope.lab.workload import WorkloadSpec

pytestmark = pytest.mark.vllm
TIMEOUT_S = 30.0


def eventually(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            found = check()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@contextmanager
def serving(config: Path, store: str, port: int, log: Path) -> Iterator[str]:
    command = [
        sys.executable,
        "-m",
        "kvscope.cli",
        "serve",
        "--config",
        str(config),
        "--store",
        store,
        "--port",
        str(port),
        "--gone-after",
        "1.5",
    ]
    proc = subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(
            lambda: proc.poll() is None and httpx.get(url + "/readyz").status_code == 200,
            "serve ready: " + log.read_text()[-2000:],
        )
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()[-2000:]


def rank_of(url: str, replica: str) -> dict[str, Any] | None:
    answer = httpx.get(f"{url}/replicas/{replica}", timeout=5)
    return answer.json()["ranks"][0] if answer.status_code == 200 else None


def publish_until_heard(replica: LabReplica, url: str, name: str) -> None:
    """The replica publishes until kvscope has heard it. Its PUB connects to kvscope's bound
    SUB, and what it sends before that connection and its subscription are up is dropped by
    ZMQ (the slow joiner): a replica that published only then would never be heard at all,
    as a real one, which publishes on, would be."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        replica.run_for(0.5)
        try:
            if (rank := rank_of(url, name)) is not None and rank["connected"]:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{name} never heard"


def test_a_fleet_replica_is_served_goes_and_is_resumed_from_the_store(tmp_path: Path) -> None:
    bind, replay = free_port(), free_port()
    config = tmp_path / "kvscope.toml"
    config.write_text(
        f'[fleet]\nbind = "tcp://127.0.0.1:{bind}"\nreplay_template = "tcp://{{ip}}:{{port}}"\n'
    )
    store = f"sqlite:///{tmp_path / 's.sqlite'}"
    name = f"127.0.0.1:{replay}"
    with ExitStack() as stack:
        replica = LabReplica(
            "a",
            WorkloadSpec(rate=4.0, seed=31),
            EngineSettings(topic=f"kv@127.0.0.1:{replay}@lab"),
            replay_port=replay,
            http_port=None,
            publish_to=f"tcp://127.0.0.1:{bind}",
        )
        stack.callback(replica.close)
        with serving(config, store, free_port(), tmp_path / "serve.log") as url:
            publish_until_heard(replica, url, name)
            replica.run_for(3.0)
            last = replica.last_seq
            rank = eventually(
                lambda: (r := rank_of(url, name)) is not None and r["last_seq"] == last and r,
                f"{name} at seq {last}",
            )
            assert rank["connected"] and rank["gone"] is False and rank["degraded"] is None
            assert rank["engine"] == "vllm"
            gone = eventually(
                lambda: (r := rank_of(url, name)) is not None and r["gone"] and r, "gone"
            )
            assert not gone["connected"] and gone["last_seq"] == last and gone["blocks"] > 0
            metrics = httpx.get(url + "/metrics").text
            assert f'kvscope_stream_gone{{rank="0",replica="{name}"}} 1.0' in metrics
            assert "kvscope_fleet_publishers 1.0" in metrics

        # A new kvscope on the same store: the replica goes on, and is taken up from the
        # store's last batch (replayed from there: no restart, no gap, not degraded).
        replica.run_for(2.0)
        with serving(config, store, free_port(), tmp_path / "serve2.log") as url:
            publish_until_heard(replica, url, name)
            replica.run_for(2.0)
            last = replica.last_seq
            rank = eventually(
                lambda: (r := rank_of(url, name)) is not None and r["last_seq"] == last and r,
                f"{name} at seq {last} after the restart",
            )
            assert rank["epoch"] == 0 and rank["restarts"] == 0 and rank["degraded"] is None
            assert rank["blocks"] == sum(replica.truth_counts().values())
    dumped = CliRunner().invoke(app, ["dump", "--store", store, "--replica", name, "--seq", "3"])
    assert dumped.exit_code == 0, dumped.output
    assert '"hash"' in dumped.output
