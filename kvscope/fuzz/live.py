"""A fuzz run through live sockets: `kvscope serve` as a subprocess, two publishers, the checks.

The script binds one XPUB socket per replica (`honest`, `hostile`) and starts `kvscope serve`
connecting to both. An XPUB receives its subscriber's subscription: publishing starts only once
both subscriptions arrived and both streams say they are connected (no slow-joiner loss), and
a second subscription later would show a reconnect (messages lost). The sender syncs with the
collector every `window` hostile messages (after an honest one, whose seq the collector must
then show as its last), so neither side queues without bound and RSS measures the collector.

Afterwards: the process is alive, `/readyz` answers 200, both streams read up to their last
seq, the honest map equals the capture's alone, the hostile map equals the offline oracle of
the same frames, and the capture's alone if every taint came before its last clear (else it is
degraded); malformed counts by kind equal the oracle's; serve logged no traceback; SIGTERM
stops it with exit 0.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import zmq

from kvscope.collector.capture import read_capture
from kvscope.fuzz import checks
from kvscope.fuzz.plan import HONEST, HOSTILE, Interleaving, Side, Tally
from kvscope.lab.ports import free_port

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "lab_3rps_180s.msgpack.gz"


@dataclass(frozen=True, slots=True)
class FuzzOptions:
    frames: int = 2_000
    seed: int = 0
    rate: float = 0.0
    """Hostile messages a second; 0: as fast as the collector takes them."""
    until_last_clear: bool = False
    """Every hostile message before the capture's last clear: the hostile map must end exact."""
    wide_seqs: bool = True
    """Seq jumps to 2**63 and 2**64 - 1 among the others."""
    classes: tuple[str, ...] = ()
    """Only these hostile classes (default: all)."""
    window: int = 2_000
    """Hostile messages sent between two syncs with the collector."""
    window_bytes: int = 64 << 20
    timeout_s: float = 600.0
    capture: Path = BUNDLED
    workdir: Path | None = None
    max_rss_growth_mib: float | None = None
    drain_s: float = 120.0
    """How long to wait, after the checks, for the store's queue to empty (RSS is read then)."""
    log: Callable[[str], None] = print


@dataclass
class FuzzResult:
    tally: Tally
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    malformed: dict[str, dict[str, int]] = field(default_factory=dict)
    """Live counts by replica and kind (`kvscope_ingest_malformed_total`)."""
    expected_malformed: dict[str, int] = field(default_factory=dict)
    store_queue_rows: float = 0.0
    """`kvscope_store_queue_rows` at the end: rows the store's writer had not written yet."""
    drained: tuple[float, int] | None = None
    """Seconds the store's queue took to empty after the checks, and serve's RSS then (KiB);
    None if it did not within `drain_s`."""
    rss_kib: tuple[int, int, int] = (0, 0, 0)
    """serve's VmRSS before and after publishing, and its VmHWM (peak) at the end."""
    wall_s: float = 0.0
    hostile_degraded: str | None = None
    clean_end: bool = True
    exit_code: int | None = None


class ServeDied(Exception):
    pass


class _Serve:
    def __init__(self, workdir: Path, endpoints: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "serve.log"
        command = [
            sys.executable,
            "-m",
            "kvscope.cli",
            "serve",
            "--store",
            f"sqlite:///{workdir / 'fuzz.sqlite'}",
            "--port",
            str(self.port),
        ]
        for name, endpoint in endpoints.items():
            command += ["--replica", f"{name}={endpoint}"]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise ServeDied(f"serve exited with {self.proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def get(self, path: str) -> httpx.Response:
        self.alive()
        return self.http.get(path)

    def rank(self, replica: str) -> dict[str, Any]:
        rank: dict[str, Any] = self.get(f"/replicas/{replica}").json()["ranks"][0]
        return rank

    def rss_kib(self, field_name: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        return 0

    def stop(self) -> int | None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                self._log.close()
                return None
        self._log.close()
        return self.proc.returncode


def _until(what: str, deadline: float, check: Callable[[], bool], serve: _Serve) -> None:
    """Poll `check` until it holds; TimeoutError at `deadline`, ServeDied when serve exits."""
    while not check():
        serve.alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _ready(serve: _Serve) -> bool:
    try:
        return serve.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


class _Publisher:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full pipe refuses, never drops
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = free_port()
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.subscriptions = 0

    def take_subscriptions(self) -> int:
        while self.sock.poll(0):
            if self.sock.recv()[:1] == b"\x01":
                self.subscriptions += 1
        return self.subscriptions

    def send(self, frames: list[bytes], serve: _Serve, deadline: float) -> None:
        while True:
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:
                serve.alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("the collector stopped reading") from None
                self.sock.poll(50, zmq.POLLOUT)


def run_fuzz(options: FuzzOptions) -> FuzzResult:
    quiet = logging.getLogger("kvscope.collector")  # the oracle's warnings are serve's too
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _fuzz(options)
    finally:
        quiet.setLevel(level)


def _fuzz(options: FuzzOptions) -> FuzzResult:
    records = list(read_capture(options.capture))
    plan = Interleaving(
        records,
        options.frames,
        options.seed,
        options.until_last_clear,
        options.wide_seqs,
        options.classes,
    )
    result = FuzzResult(plan.tally, clean_end=True)
    with tempfile.TemporaryDirectory(prefix="kvscope-fuzz-") as tmp:
        workdir = options.workdir or Path(tmp)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        pubs = {HONEST: _Publisher(ctx), HOSTILE: _Publisher(ctx)}
        serve = _Serve(workdir, {n: f"tcp://127.0.0.1:{p.port}" for n, p in pubs.items()})
        started = time.monotonic()
        try:
            _run(serve, pubs, plan, options, result)
        except (ServeDied, TimeoutError, httpx.HTTPError) as exc:
            result.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            result.wall_s = time.monotonic() - started
            result.exit_code = serve.stop()
            for pub in pubs.values():
                pub.sock.close(linger=0)
            ctx.term()
        checks.after_stop(serve.log_path, result)
        if result.failures:
            options.log(f"serve's log (last lines):\n{serve.log_tail(6000)}")
    result.clean_end = plan.clean_end
    return result


def _run(
    serve: _Serve,
    pubs: dict[str, _Publisher],
    plan: Interleaving,
    options: FuzzOptions,
    result: FuzzResult,
) -> None:
    deadline = time.monotonic() + options.timeout_s
    _until("/readyz", min(deadline, time.monotonic() + 120), lambda: _ready(serve), serve)
    _until(
        "both subscriptions",
        deadline,
        lambda: all(p.take_subscriptions() for p in pubs.values()),
        serve,
    )
    _until(
        "both streams connected",
        deadline,
        lambda: all(serve.rank(n)["connected"] for n in pubs),
        serve,
    )
    rss_before = serve.rss_kib()
    options.log(f"serve pid {serve.proc.pid} ready at {serve.url}, RSS {rss_before} KiB")
    in_flight = in_bytes = sent = 0
    gap = 1.0 / options.rate if options.rate > 0 else 0.0
    next_at = time.monotonic()
    for side, frames, seq in plan.messages():
        pubs[side.value].send(frames, serve, deadline)
        if side is Side.HOSTILE and seq is None:
            in_flight, in_bytes, sent = in_flight + 1, in_bytes + sum(map(len, frames)), sent + 1
            if gap:
                next_at += gap
                if (wait := next_at - time.monotonic()) > 0:
                    time.sleep(wait)  # pacing at --rate, not a synchronisation
        elif side is Side.HOSTILE and (
            in_flight >= options.window or in_bytes >= options.window_bytes
        ):
            _sync(serve, plan, deadline)
            options.log(f"  {sent} hostile messages sent, RSS {serve.rss_kib()} KiB")
            in_flight = in_bytes = 0
    _sync(serve, plan, deadline)
    rss_after = serve.rss_kib()
    result.rss_kib = (rss_before, rss_after, serve.rss_kib("VmHWM"))
    resubscribed = {n: p.take_subscriptions() - 1 for n, p in pubs.items()}
    checks.live_state(serve.get, plan, result, resubscribed)
    _drain(serve, options, result)
    if options.max_rss_growth_mib is not None and (
        (rss_after - rss_before) / 1024 > options.max_rss_growth_mib
    ):
        result.failures.append(f"RSS grew {(rss_after - rss_before) / 1024:.0f} MiB")


def _drain(serve: _Serve, options: FuzzOptions, result: FuzzResult) -> None:
    """Wait (bounded) for the store's writer to catch up; serve's RSS then tells a backlog from
    a leak."""
    started = time.monotonic()
    try:
        _until(
            "the store's queue to empty",
            started + options.drain_s,
            lambda: checks.store_queue_rows(serve.get("/metrics").text) == 0,
            serve,
        )
    except TimeoutError:
        result.notes.append(f"the store's queue did not empty in {options.drain_s:.0f} s")
        return
    result.drained = (time.monotonic() - started, serve.rss_kib())


def _sync(serve: _Serve, plan: Interleaving, deadline: float) -> None:
    """Wait until both streams have read everything sent (the last message was honest): the
    honest one its last seq, the hostile one where the oracle is, last seq and refusals (a
    batch it refused, a seq that went back too soon, moves no seq)."""
    honest_seq, oracle = plan.tally.honest_last_seq, plan.oracle
    _until(
        f"{HONEST} to reach seq {honest_seq}",
        deadline,
        lambda: serve.rank(HONEST)["last_seq"] == honest_seq,
        serve,
    )
    want = (oracle.last_seq, dict(oracle.counters.malformed))

    def caught_up() -> bool:
        counts = checks.malformed_counts(serve.get("/metrics").text).get(HOSTILE, {})
        return (serve.rank(HOSTILE)["last_seq"], counts) == want

    _until(f"{HOSTILE} to reach the oracle's seq {want[0]}", deadline, caught_up, serve)
