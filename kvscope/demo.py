"""`kvscope demo`: two replicas, real sockets, the collector, the store, the API, and what each
reset did.

With vLLM installed the replicas are lab replicas (vLLM's real scheduler, `kvscope.lab`, under
the `keep-reset-study` preset: as busy as the study's server was), reset through kvscope's own
`POST /replicas/{replica}/reset`; without it, the bundled capture (the same scheduler, recorded
with resets in three modes) is played by two stand-in publishers and its resets are stored as
reset requests. Either way the table shows, for each reset asked for,
the clear the API links to it (`kvscope.storage.reset_links`, as `GET /resets` does).
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from rich.console import Console
from sqlalchemy import insert

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import read_capture
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.config import Config, ReplicaConfig, StoreConfig
from kvscope.demo_table import Asked, compact_table, reset_table
from kvscope.lab.presets import KEEP_RESET_STUDY
from kvscope.pipeline import running_pipeline
from kvscope.report import load_resets, reset_ids, rows_so_far, write_with_prefixes
from kvscope.report_compare import write_compare
from kvscope.serve import api_settings
from kvscope.signals import stop_on_signals
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import stream_id
from kvscope.storage.mode_compare import RowsAfter
from kvscope.storage.reset_links import clears_by_request, load_requests
from kvscope.storage.scrape import MetricsScraper
from kvscope.storage.token_text import TokenText
from kvscope.storage.writer import StoreWriter

CAPTURE = "lab_3rps_180s"
NAMES = ("lab-a", "lab-b")
MODES = ("default", "preempt", "keep")
WARM_S, GAP_S, TAIL_S, SCRAPE_S = 40.0, 70.0, 301.0, 2.0
"""Lab timeline (simulated s): resets at 40, 110, 180; then the last 300 s window passes."""


def _bundled(name: str) -> Path:
    return Path(str(resources.files("kvscope") / "data" / name))


@dataclass
class DemoOptions:
    speed: float = 0.0
    source: str = "auto"
    store: str | None = None
    port: int = 0
    out: Path = Path("kvscope-demo")
    serve: bool = False
    text: TokenText | None = None
    """--tokenizer: prefix groups' first tokens as text in the API, page and report."""
    as_json: bool = False
    """--json: one JSON document on stdout; the console given to `run_demo` has the progress."""


@contextmanager
def serving_api(app: Any, port: int) -> Iterator[str]:
    """uvicorn on 127.0.0.1 in a thread (signals stay with the caller); yields its URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="kvscope-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise RuntimeError(f"the API did not start on 127.0.0.1:{port}")
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(10)


def _lab_available() -> bool:
    try:
        import kvscope.lab.replica  # noqa: F401
    except ImportError:
        return False
    return True


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _map_of(collector: Collector, name: str) -> tuple[dict[tuple[int, int], int], Any, Any]:
    with collector.lock:
        ingest = collector.ingests[StreamId(name, 0)]
        return ingest.map.counts(), ingest.map.totals(), ingest.degraded


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
                _wait(lambda: self.caught_up(collector, applied), 30, "the collector")
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
        _wait(lambda: self.caught_up(collector, applied), 30, "the collector")
        return asked

    def check(self, collector: Collector, console: Console) -> bool:
        exact = True
        for r in self.replicas:
            counts, _, degraded = _map_of(collector, r.name)
            truth = r.truth_counts()
            same = counts == truth and degraded is None
            exact &= same
            verdict = "[green]equals[/]" if same else "[red]DIFFERS FROM[/]"
            console.print(
                f"{r.name}: the map {verdict} vLLM's BlockPool.cached_block_hash_to_block"
                f" at seq {r.last_seq} ({len(truth)} hashes)"
            )
        return exact


class CaptureDemo:
    """The bundled capture, played by two stand-in publishers under two names."""

    def __init__(self, stack: ExitStack, speed: float) -> None:
        self.records = list(read_capture(_bundled(f"{CAPTURE}.msgpack.gz")))
        self.sidecar = json.loads(_bundled(f"{CAPTURE}.json").read_text())
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

        _wait(done, 120, "the capture to play")
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
            arrived = max(held.batch.recv_ts for held in batch_log.held_at(conn, sid, seq))
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
        exact = True
        for name in NAMES:
            counts, _, degraded = _map_of(collector, name)
            same = counts == expected and degraded is None
            exact &= same
            verdict = "[green]equals[/]" if same else "[red]DIFFERS FROM[/]"
            console.print(
                f"{name}: the map {verdict} vLLM's BlockPool.cached_block_hash_to_block"
                f" at seq {truth['published_through_seq']} (recorded, "
                f"{len(expected)} hashes)"
            )
        return exact


def _finish(
    console: Console,
    store: str,
    start: RowsAfter,
    asked: list[Asked],
    options: DemoOptions,
    window: float,
) -> dict[str, Any]:
    """Print the table and where the report went; the same as a JSON-ready summary."""
    out = options.out
    engine = open_store(store)
    ids = [i for n in NAMES for i in reset_ids(engine, n, 0, 1e11) if i > start.reset_id]
    resets = load_resets(engine, ids, window)  # each with the mode of its linked request
    # The links the API gives (GET /resets): the same rule over the same rows.
    with engine.connect() as conn:
        clears = clears_by_request(conn, window, start.reset_id)
        requests = {int(q.id): q for qs in load_requests(conn).values() for q in qs}
    table = reset_table(asked, requests, clears, {d.id: d for d in resets}, window)
    if not options.as_json:
        console.print(compact_table(table))
    linked = sorted((d for d in resets if d.mode is not None), key=lambda d: d.id)
    png, page = write_with_prefixes(engine, linked or resets, out, options.text)
    compared = [write_compare(engine, n, 0.0, 1e11, out / n, start)[1] for n in NAMES]
    engine.dispose()
    console.print(f"report: {page} ({png.name}); store: {store}")
    console.print("modes side by side: " + ", ".join(str(p) for p in compared))
    console.print(
        f"again: kvscope report --store {store} --reset "
        f"{','.join(str(d.id) for d in linked or resets)} --out {out}"
        + ("" if options.text is None else f" --tokenizer {options.text.path}")
    )
    return {
        "resets": table.as_json(),
        "report": str(page),
        "compare": [str(p) for p in compared],
        "store": store,
    }


def _print_json(options: DemoOptions, api: str, exact: bool, summary: dict[str, Any]) -> None:
    if options.as_json:
        sys.stdout.write(json.dumps({"exact": exact, "api": api, **summary}) + "\n")
        sys.stdout.flush()


def _urls(console: Console, api: str) -> None:
    console.print(f"API  {api}\npage {api}/\ndocs {api}/docs", soft_wrap=True)


def run_demo(console: Console, options: DemoOptions) -> int:
    lab = options.source == "lab" or (options.source == "auto" and _lab_available())
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    store = options.store
    if store is None:
        for suffix in ("", "-wal", "-shm"):
            (out / f"demo.sqlite{suffix}").unlink(missing_ok=True)
        store = f"sqlite:///{(out / 'demo.sqlite').resolve()}"
    token = secrets.token_urlsafe(16)
    started = time.monotonic()
    with ExitStack() as stack:
        demo: LabDemo | CaptureDemo = (LabDemo if lab else CaptureDemo)(stack, options.speed)
        what = (
            "two lab replicas (vLLM's real scheduler, simulated time)"
            if lab
            else f"the bundled capture {CAPTURE} played as two replicas"
        )
        console.print(f"[bold]kvscope demo[/]: {what}: {', '.join(NAMES)}")
        config = demo.config()
        settings = api_settings(config, token, options.text)
        window = settings.link_window_s
        engine = open_store(store)
        start = rows_so_far(engine)
        engine.dispose()
        with running_pipeline(replace(config, store=StoreConfig(store))) as (collector, writer, _):
            assert writer is not None
            app = create_app(
                ApiData(collector=collector, engine=writer.engine, writer=writer), settings
            )
            with serving_api(app, options.port) as api:
                _urls(console, api)
                _wait(
                    lambda: all(collector.is_connected(s) for s in collector.ingests),
                    20,
                    "the collector to connect",
                )
                asked = demo.run(collector, writer, api, token)
                exact = demo.check(collector, console)
                # Recovery points are queued as the streams pass them: the table reads them
                # once written (with --serve the writer stays open; without, close writes).
                writer.flush()
                if options.serve:
                    summary = _finish(console, store, start, asked, options, window)
                    _print_json(options, api, exact, summary)
                    _urls(console, api)
                    console.print("serving until Ctrl-C (SIGINT) or SIGTERM")
                    with stop_on_signals() as stop:
                        stop.wait()
        if not options.serve:
            summary = _finish(console, store, start, asked, options, window)
            _print_json(options, api, exact, summary)
            console.print(f"API was {api} (page /, docs /docs); --serve keeps it running")
    console.print(f"done in {time.monotonic() - started:.1f} s")
    return 0 if exact else 1
