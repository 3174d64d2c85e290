"""What `kvscope demo` runs: two lab replicas (vLLM's scheduler) or the bundled capture played
as two replicas, and how it checks each map against the truth (kvscope/demo.py drives them)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from sqlalchemy import insert

from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import read_capture
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.config import Config, ReplicaConfig
from kvscope.demo_table import Asked
from kvscope.lab.presets import KEEP_RESET_STUDY
from kvscope.storage import batch_log, schema
from kvscope.storage.history import stream_id
from kvscope.storage.scrape import MetricsScraper
from kvscope.storage.writer import StoreWriter

CAPTURE = "lab_3rps_180s"
NAMES = ("lab-a", "lab-b")
MODES = ("default", "preempt", "keep")
WARM_S, GAP_S, TAIL_S, SCRAPE_S = 40.0, 70.0, 301.0, 2.0
"""Lab timeline (simulated s): resets at 40, 110, 180; then the last 300 s window passes."""


def bundled(name: str) -> Path:
    return Path(str(resources.files("kvscope") / "data" / name))


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _map_of(collector: Collector, name: str) -> tuple[dict[tuple[int, int], int], Any, Any]:
    with collector.lock:
        ingest = collector.ingests[StreamId(name, 0)]
        return ingest.map.counts(), ingest.map.totals(), ingest.degraded


def _compared(
    collector: Collector,
    console: Console,
    name: str,
    truth: dict[tuple[int, int], int],
    where: str,
) -> bool:
    """Whether `name`'s map is `truth` (and not degraded), said on the console."""
    counts, _, degraded = _map_of(collector, name)
    same = counts == truth and degraded is None
    verdict = "[green]equals[/]" if same else "[red]DIFFERS FROM[/]"
    console.print(
        f"{name}: the map {verdict} vLLM's BlockPool.cached_block_hash_to_block"
        f" {where} ({len(truth)} hashes)"
    )
    return same


class _Applied:
    """Whether the collector has applied a whole run of a stream.

    On a reused store the collector resumes at the last run's final seq, which this run
    counts up to again: the seq alone would say "caught up" before this run's batches arrive.
    So the batches applied since the run began are counted too.
    """

    def __init__(self, collector: Collector) -> None:
        with collector.lock:
            self._before = {s: i.counters.batches_applied for s, i in collector.ingests.items()}

    def through(self, collector: Collector, name: str, last_seq: int | None) -> bool:
        """Seqs 0..`last_seq` of this run applied; call with `collector.lock` held."""
        stream = StreamId(name, 0)
        ingest = collector.ingests[stream]
        applied = ingest.counters.batches_applied - self._before[stream]
        return (
            last_seq is not None
            and ingest.last_seq == last_seq
            and not ingest.replaying
            and applied >= last_seq + 1
        )


def _sim_clock(replica: Any) -> Callable[[], float]:
    return lambda: float(replica.ts)


class LabDemo:
    """Two lab replicas, driven in lockstep on this thread, reset through kvscope's API."""

    def __init__(self, stack: ExitStack, speed: float) -> None:
        from kvscope.lab.replica import LabReplica

        logging.getLogger("vllm").setLevel(logging.ERROR)  # refusals show in the table
        load = KEEP_RESET_STUDY
        self.replicas = [
            stack.enter_context(
                LabReplica(n, load.workload, load.engine, speed=speed, stream=i, preset=load.name)
            )
            for i, n in enumerate(NAMES)
        ]

    def config(self) -> Config:
        return Config([ReplicaConfig(r.name, str(r.http_url)) for r in self.replicas])

    def caught_up(self, collector: Collector, applied: _Applied) -> bool:
        with collector.lock:
            return all(applied.through(collector, r.name, r.last_seq) for r in self.replicas)

    def run(self, collector: Collector, writer: StoreWriter, api: str, token: str) -> list[Asked]:
        scrapers = [
            # Stamped with the replica's simulated clock, like its batches.
            MetricsScraper(writer.engine, {r.name: f"{r.http_url}/metrics"}, clock=_sim_clock(r))
            for r in self.replicas
        ]
        asked: list[Asked] = []
        applied = _Applied(collector)

        def advance(until: float) -> None:
            while (now := min(r.sim_t for r in self.replicas)) < until:
                target = min(until, (now // SCRAPE_S + 1) * SCRAPE_S)
                for replica in self.replicas:
                    replica.run_until_time(target)
                for scraper in scrapers:
                    scraper.scrape_once()

        with ThreadPoolExecutor(1) as pool:
            for i, mode in enumerate(MODES):
                advance(WARM_S + i * GAP_S)
                wait_for(lambda: self.caught_up(collector, applied), 30, "the collector")
                for r in self.replicas:
                    _, totals, _ = _map_of(collector, r.name)
                    done = len(r.resets)
                    future = pool.submit(
                        httpx.post,
                        f"{api}/replicas/{r.name}/reset",
                        params={"mode": mode},
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=30,
                    )
                    while not future.done():
                        r.apply_pending(timeout=0.02)
                    response = future.result()
                    response.raise_for_status()
                    # The engine's own record of the reset, when the request reached it.
                    record = r.resets[-1] if len(r.resets) > done else None
                    asked.append(
                        Asked(
                            int(response.json()["id"]),
                            (totals.blocks, totals.hittable),
                            None if record is None else record.running_before,
                            None if record is None else record.held_blocks_before,
                        )
                    )
            advance(WARM_S + (len(MODES) - 1) * GAP_S + TAIL_S)
        for r in self.replicas:
            if r.pending_events:
                r.step()
        wait_for(lambda: self.caught_up(collector, applied), 30, "the collector")
        return asked

    def check(self, collector: Collector, console: Console) -> bool:
        exact = True
        for r in self.replicas:
            truth = r.truth_counts()
            exact &= _compared(collector, console, r.name, truth, f"at seq {r.last_seq}")
        return exact


class CaptureDemo:
    """The bundled capture, played by two stand-in publishers under two names."""

    def __init__(self, stack: ExitStack, speed: float) -> None:
        self.records = list(read_capture(bundled(f"{CAPTURE}.msgpack.gz")))
        self.sidecar = json.loads(bundled(f"{CAPTURE}.json").read_text())
        self.sources = [CaptureSource(self.records, speed=speed) for _ in NAMES]
        for source in self.sources:
            stack.callback(source.close)

    def config(self) -> Config:
        return Config(
            [
                ReplicaConfig(n, s.endpoint, replay=s.replay_endpoint)
                for n, s in zip(NAMES, self.sources, strict=True)
            ]
        )

    def run(self, collector: Collector, writer: StoreWriter, api: str, token: str) -> list[Asked]:
        applied = _Applied(collector)
        for source in self.sources:
            source.play()
        last = self.records[-1].seq

        def done() -> bool:
            with collector.lock:
                return all(applied.through(collector, n, last) for n in NAMES)

        wait_for(done, 120, "the capture to play")
        writer.flush()
        return [self._record(writer, n, r) for n in NAMES for r in self.sidecar["resets"]]

    def _record(self, writer: StoreWriter, name: str, reset: dict[str, Any]) -> Asked:
        """A recorded reset, stored as a reset request so the API links it like any other.

        Its time is on the collector's clock, as the API's requests are: when the last batch
        the engine had published before the reset arrived (the recording's clock is simulated).
        """
        t = schema.reset_requests
        seq = reset["published_through_seq_before"]
        with writer.engine.begin() as conn:
            sid = stream_id(conn, name)
            arrived = max(held.stamp.recv_ts for held in batch_log.held_at(conn, sid, seq))
            request_id = conn.execute(
                insert(t)
                .values(
                    replica=name,
                    requested_at=arrived,
                    requested_by=f"recording {CAPTURE}",
                    mode=reset["mode"],
                    external=bool(reset.get("reset_external", False)),
                    outcome="success" if reset["result"] else "refused",
                    http_status=None,
                    detail=f"recorded at {reset['sim_t']:.2f} s (simulated), step {reset['step']}",
                )
                .returning(t.c.id)
            ).scalar_one()
        return Asked(int(request_id), None, reset["running_before"], reset["held_blocks_before"])

    def check(self, collector: Collector, console: Console) -> bool:
        truth = max(
            (s for s in self.sidecar["snapshots"] if s["pending_events"] == 0),
            key=lambda s: s["published_through_seq"],
        )
        expected = {(h, g): n for h, g, n in truth["hashes"]}
        where = f"at seq {truth['published_through_seq']}, recorded"
        exact = True
        for name in NAMES:
            exact &= _compared(collector, console, name, expected, where)
        return exact
