"""The page at `/`, in a real browser: headless Chromium (Debian's `chromium`) loads it from a
real uvicorn serving a store-only API over a store filled from the bundled capture, runs its
script, and the DOM it leaves shows the replica, the resets and the newest reset's recovery
chart. A screenshot is saved in the test's tmp dir (`page.png`)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.api.page import CSP, page_router
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.demo_sources import bundled
from kvscope.lab.ports import free_port
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.requests_support import insert_requests

REPLICA = "lab"


def fill_store(url: str) -> None:
    """The bundled capture through the live ingest path with the store attached, and the
    requests through kvscope that caused its resets, as the API records them."""
    writer = StoreWriter(open_store(url), StoreSettings())
    ingest = StreamIngest(
        StreamId(REPLICA, 0),
        can_replay=False,
        sink=writer,
    )
    for record in read_capture(bundled("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    insert_requests(writer.engine, REPLICA, detail=False)


def with_page(app: FastAPI) -> FastAPI:
    """The page on the app (once `create_app` includes it, this adds nothing)."""
    if not any(getattr(route, "path", None) == "/" for route in app.routes):
        app.include_router(page_router)
    return app


@dataclass
class Served:
    url: str
    folder: Path


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` on a real uvicorn at a free port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("page")
    store = f"sqlite:///{folder / 'store.sqlite'}"
    fill_store(store)
    with serving(with_page(create_app(ApiData(engine=open_store(store))))) as url:
        yield Served(url, folder)


def chromium(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("no chromium: run scripts/install-test-services.sh")
    command = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={folder / 'chromium-profile'}",
        "--virtual-time-budget=10000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


class Dom(HTMLParser):
    """Elements by id, rows by data attributes, and the text under each id'd element."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text_by_id: dict[str, str] = {}
        self._open: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes))
        if tag not in ("br", "meta", "link", "input", "img", "line", "circle", "path"):
            self._open.append(attributes.get("id"))
            if "id" in attributes:
                self.text_by_id.setdefault(attributes["id"], "")

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for element_id in self._open:
            if element_id is not None:
                self.text_by_id[element_id] += data

    def find(self, tag: str | None = None, **attrs: str) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.elements
            if (tag is None or t == tag)
            and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


def test_the_page_is_served_with_a_strict_policy(served: Served) -> None:
    response = httpx.get(served.url + "/", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CSP
    assert "<script>" in response.text and "src=" not in response.text
    schema_paths = httpx.get(served.url + "/openapi.json", timeout=10).json()["paths"]
    assert "/" not in schema_paths


def test_chromium_shows_replicas_resets_and_a_recovery_chart(served: Served) -> None:
    replicas = httpx.get(served.url + "/replicas", timeout=30).json()
    resets = httpx.get(served.url + "/resets", timeout=30).json()
    newest = resets[-1]
    detail = httpx.get(served.url + f"/resets/{newest['id']}", timeout=30).json()
    assert len(resets) == 2 and detail["recovery"]

    started = time.monotonic()
    dumped = chromium(served.folder, "--dump-dom", served.url + "/")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = Dom()
    dom.feed(dumped.stdout)

    (row,) = dom.find("tr", data_replica=REPLICA)
    assert row["data-rank"] == "0"
    rank = replicas[0]["ranks"][0]
    text = dom.text_by_id["replicas-body"]
    assert REPLICA in text and f"{rank['blocks']:,}" in text and "stored" in text
    shown = [int(a["data-reset-id"]) for a in dom.find("tr") if "data-reset-id" in a]
    assert shown == [r["id"] for r in reversed(resets)]  # newest first
    assert dom.find("tr", data_reset_id=str(newest["id"]), **{"class": "selected"})
    assert "keep" in dom.text_by_id["resets-body"] and "preempt" in dom.text_by_id["resets-body"]
    assert dom.text_by_id["reset-title"] == f"Reset #{newest['id']} on {REPLICA}/0"
    facts = dom.text_by_id["reset-facts"]
    assert "keep, success" in facts and f"{newest['before_blocks']} blocks" in facts
    assert dom.find("svg", id="recovery-chart")
    series = [a["class"] for a in dom.find("path") if a.get("class", "").startswith("series")]
    assert series == ["series blocks", "series hittable", "series orphans"]
    path = next(a["d"] for a in dom.find("path") if a.get("class") == "series blocks")
    assert len(re.findall(r"[ML]", path)) == len(detail["recovery"])
    assert len(dom.find("line", **{"class": "marker"})) == 2  # t50 and t90
    # The recording ends 45 s after the newest reset: its recovery is partial, and says so.
    assert detail["recovery_complete"] is False and detail["offsets_reached"][-1] == 30.0
    assert dom.text_by_id["recovery-partial"].startswith(
        "partial: offsets up to +30 s reached, last batch at 20"
    )
    rows = dom.text_by_id["before-after"]
    assert rows.count(" s") >= len(detail["recovery"]) and "before" in rows

    # Another reset by its URL.
    older = resets[0]["id"]
    dumped = chromium(served.folder, "--dump-dom", served.url + f"/#reset={older}")
    dom = Dom()
    dom.feed(dumped.stdout)
    assert dom.text_by_id["reset-title"] == f"Reset #{older} on {REPLICA}/0"
    assert "preempt, success" in dom.text_by_id["reset-facts"]

    shot = served.folder / "page.png"
    taken = chromium(
        served.folder, f"--screenshot={shot}", "--window-size=1280,1500", served.url + "/"
    )
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1280, 1500)
    assert shot.stat().st_size > 30_000  # text, tables and a chart, not a blank page
    assert time.monotonic() - started < 120


def test_chromium_draws_the_prefix_groups_before_vs_after(served: Served) -> None:
    resets = httpx.get(served.url + "/resets", timeout=30).json()
    newest = resets[-1]["id"]
    prefixes = httpx.get(served.url + f"/resets/{newest}/prefixes?limit=500", timeout=30).json()
    assert prefixes["groups_total"] == len(prefixes["items"]) >= 2

    dumped = chromium(served.folder, "--dump-dom", served.url + f"/#reset={newest}")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = Dom()
    dom.feed(dumped.stdout)
    assert dom.find("svg", id="prefix-chart")
    groups = [a for a in dom.find("rect") if a.get("class") == "group"]
    assert len(groups) == prefixes["groups_total"]  # one rectangle per group
    assert [a["data-status"] for a in groups] == [g["status"] for g in prefixes["items"]]
    widths = [float(a["width"]) for a in groups]
    assert widths == sorted(widths, reverse=True)  # as wide as their tokens, largest first
    assert len([a for a in dom.find("rect") if a.get("class") == "back"]) == len(groups)
    chart = dom.text_by_id["prefix-chart"]
    assert all(f"root {g['root_text']} " in chart for g in prefixes["items"])  # the tooltips
    legend = dom.text_by_id["prefix-legend"]
    for status in ("back at +1 s", "back at +10 s", "back at +60 s", "back later", "not back"):
        assert status in legend
    assert "partial" in dom.text_by_id["prefix-summary"]
    # The newest reset is the keep-running one: its orphans are told.
    assert prefixes["orphans_total"] >= 1
    assert dom.text_by_id["prefix-orphans"].startswith(
        f"Orphans the reset left: {prefixes['orphans_total']}"
    )
