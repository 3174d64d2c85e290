"""One trial of benchmarks/fleet.py: N publishers into one collector in bind mode, store on or off.

The collector runs in this process (its loop thread and the store's writer thread, as
`kvscope collect --bind` runs them); the publishers run in spawned processes
(benchmarks/_fleet_publishers.py). The lag is observed from outside the collector's path
(`AppliedSampler`): the store's writer is the collector's sink, as in the daemon.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import threading
import time
from array import array
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from _fleet_publishers import Plan, Sent, Stream, run_publishers
from _pg import database_url, fresh_database
from sqlalchemy import text

from kvscope.collector.fleet import FleetSettings
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port
from kvscope.pipeline import StoreStarter
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreWriter

STORES = ("none", "sqlite", "postgresql")
MAX_LAG_S = 1.0
MAX_DRAIN_S = 1.0
"""The store keeps up when what it holds back at the end is written within this."""
SETTLE_S = 10.0
"""How long the collector may take to apply the last batches sent before they count as lost."""


class AppliedSampler:
    """Which batch each stream has applied, read from the collector's ingests every `period_s`
    on a thread of its own: the collector runs with the sink the daemon gives it (the store's
    writer, told of each batch in C), with nothing of the measurement in its path. A batch
    counts as applied at the first sample that shows it (so a lag is at most `period_s` long);
    the thread's own CPU is kept to be taken off the collector's."""

    def __init__(self, collector: Collector, period_s: float = 0.01) -> None:
        self._collector = collector
        self._period_s = period_s
        self.seen: dict[StreamId, tuple[array[float], array[int]]] = {}
        """Per stream: the sample times at which its last applied seq moved, and that seq."""
        self.cpu_s = 0.0
        """This thread's CPU seconds so far."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="applied-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seen = self.seen
        while not self._stop.wait(self._period_s):
            now = time.time()
            for stream, ingest in self._collector.ingests.items():
                seq = ingest.last_seq
                if seq is None:
                    continue
                times, seqs = seen.get(stream) or seen.setdefault(stream, (array("d"), array("q")))
                if not seqs or seqs[-1] != seq:
                    times.append(now)
                    seqs.append(seq)
            self.cpu_s = time.thread_time()

    def applied(self, stream: StreamId) -> int:
        """Batches of `stream` applied (its seqs start at 0)."""
        ingest = self._collector.ingests.get(stream)
        return 0 if ingest is None or ingest.last_seq is None else ingest.last_seq + 1

    def lags(self, stream: StreamId, sent_ts: array[float], since: float) -> Iterator[float]:
        """Each batch's lag from its send time to the sample that first showed it applied, for
        batches sent from `since`; a batch never shown has none."""
        times, seqs = self.seen.get(stream, (array("d"), array("q")))
        at = 0
        for seq, ts in enumerate(sent_ts):
            while at < len(seqs) and seqs[at] < seq:
                at += 1
            if at == len(seqs):
                return
            if ts >= since:
                yield times[at] - ts


@dataclass(frozen=True)
class Trial:
    store: str
    replicas: int
    seconds: float
    """Measured: from the end of the warm-up to the end of sending."""
    batches_sent: int
    lag_p50_s: float
    lag_p99_s: float
    lag_max_s: float
    unapplied: int
    """Batches sent and never applied to the map."""
    store_dropped: int
    """Batches the store's queue dropped (marked incomplete in the store)."""
    degraded: int
    """Degraded intervals opened: gaps the replay did not fill."""
    replays: int
    drain_s: float
    """The store's backlog at the end: the time to write it (0 without a store)."""
    cpu_cores: float
    """The collector process's CPU seconds per second over the measured span."""
    store_bytes: int
    store_bytes_per_replica_hour: float

    @property
    def lost(self) -> int:
        return self.unapplied + self.store_dropped + self.degraded

    @property
    def cpu_per_replica(self) -> float:
        return self.cpu_cores / self.replicas

    @property
    def replicas_per_core(self) -> float:
        return self.replicas / self.cpu_cores if self.cpu_cores else 0.0

    @property
    def kept_up(self) -> bool:
        return self.lag_p99_s <= MAX_LAG_S and self.lost == 0 and self.drain_s <= MAX_DRAIN_S


@contextmanager
def _store(kind: str) -> Iterator[tuple[str | None, str]]:
    """(store URL or None, how to measure its size) for one trial, removed after it."""
    if kind == "none":
        yield None, ""
    elif kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="kvscope-fleet-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'fleet.sqlite'}", str(Path(tmp) / "fleet.sqlite")
    elif kind == "postgresql":
        with fresh_database("fleetbench_") as name:
            yield database_url(name), name
    else:
        raise ValueError(f"unknown store {kind!r}: one of {', '.join(STORES)}")


def _size(kind: str, writer: StoreWriter | None, where: str) -> int:
    if writer is None:
        return 0
    if kind == "sqlite":
        with writer.engine.connect() as conn:  # the WAL's pages into the file: its real size
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(
            Path(where + tail).stat().st_size
            for tail in ("", "-wal")
            if Path(where + tail).exists()
        )
    with writer.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_database_size(:n)"), {"n": where}).scalar_one())


def _percentile(values: array[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_trial(
    kind: str,
    replicas: int,
    stream: Stream,
    seed: int,
    procs: int,
    warmup_s: float,
    duration_s: float,
) -> Trial:
    """One trial: `replicas` publishers over `procs` processes for warm-up + duration."""
    procs = max(1, min(procs, replicas))
    spawn = mp.get_context("spawn")
    with ExitStack() as stack:
        url, where = stack.enter_context(_store(kind))
        writer = None if url is None else StoreWriter(open_store(url))
        size_before = _size(kind, writer, where)
        bind = f"tcp://127.0.0.1:{free_port()}"
        collector = Collector(
            [],
            settings=CollectorSettings(),
            sink=writer,
            fleet=FleetSettings(bind, replay_template="tcp://{ip}:{port}", max_publishers=65_536),
            starter=None if writer is None else StoreStarter(writer),
        )
        collector.start()
        sampler = AppliedSampler(collector)
        sampler.start()
        stop_sending, stop = spawn.Event(), spawn.Event()
        children = []
        for p in range(procs):
            share = replicas // procs + (p < replicas % procs)
            ours, theirs = spawn.Pipe()
            mine_start, their_start = spawn.Pipe()
            part = Plan(bind, share, stream, seed + p)
            child = spawn.Process(
                target=run_publishers,
                args=(part, theirs, their_start, stop_sending, stop),
                daemon=True,
            )
            child.start()
            children.append((child, ours, mine_start))
        for _, ready, _ in children:
            ready.recv()
        t0 = time.time() + 0.2
        for _, _, start_at in children:
            start_at.send(t0)
        since = t0 + warmup_s
        time.sleep(max(0.0, since - time.time()))
        cpu0, wall0 = time.process_time() - sampler.cpu_s, time.perf_counter()
        time.sleep(duration_s)
        cpu1, wall1 = time.process_time() - sampler.cpu_s, time.perf_counter()
        stop_sending.set()
        sending_s = time.time() - t0
        sent: list[Sent] = []
        stop.set()
        for child, ready, _ in children:
            sent += ready.recv()
            child.join(10)
        expected = {StreamId(s.replica, 0): s.batches for s in sent}
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and any(
            sampler.applied(s) < n for s, n in expected.items()
        ):
            time.sleep(0.05)
        sampler.stop()
        collector.stop()
        lags = array("d")
        for s in sent:
            lags.extend(sampler.lags(StreamId(s.replica, 0), s.sent_ts, since))
        degraded = sum(len(ingest.degraded_history) for ingest in collector.ingests.values())
        drain_started = time.perf_counter()
        if writer is not None:
            writer.flush(60)
        drain_s = time.perf_counter() - drain_started if writer is not None else 0.0
        dropped = 0 if writer is None else writer.stats.batches_dropped
        if writer is not None:
            writer.close()
        size = _size(kind, writer, where) - size_before
        if writer is not None:
            writer.engine.dispose()
        unapplied = sum(max(0, n - sampler.applied(s)) for s, n in expected.items())
        return Trial(
            store=kind,
            replicas=replicas,
            seconds=wall1 - wall0,
            batches_sent=sum(expected.values()),
            lag_p50_s=_percentile(lags, 0.50),
            lag_p99_s=_percentile(lags, 0.99),
            lag_max_s=max(lags, default=0.0),
            unapplied=unapplied,
            store_dropped=dropped,
            degraded=degraded,
            replays=sum(s.replays for s in sent),
            drain_s=drain_s,
            cpu_cores=(cpu1 - cpu0) / (wall1 - wall0),
            store_bytes=size,
            store_bytes_per_replica_hour=size / replicas / (sending_s / 3600),
        )
    raise AssertionError("unreachable")
