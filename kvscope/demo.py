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
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvicorn
from rich.console import Console

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.config import StoreConfig
from kvscope.demo_sources import CAPTURE, NAMES, CaptureDemo, LabDemo, wait_for
from kvscope.demo_table import Asked, compact_table, reset_table
from kvscope.pipeline import running_pipeline
from kvscope.report import load_resets, reset_ids, rows_so_far, write_with_prefixes
from kvscope.report_compare import write_compare
from kvscope.serve import api_settings
from kvscope.signals import stop_on_signals
from kvscope.storage.engine import open_store
from kvscope.storage.mode_compare import RowsAfter
from kvscope.storage.reset_links import clears_by_request, load_requests
from kvscope.storage.token_text import TokenText


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
                wait_for(
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
