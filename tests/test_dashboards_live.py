"""Every PromQL and SQL query of the dashboards runs on a real Prometheus and PostgreSQL store."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.capture_source import CaptureSource
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.dashboards.model import Json
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.dashboards_stack import (
    LabVllm,
    Stack,
    interpolate,
    lab_records,
    once,
    pg_database,
    serve_app,
    start_prometheus,
)
from tests.dashboards_support import (
    PLAY_S,
    PROM_QUERIES,
    REPLICA,
    SCRAPE_S,
    SQL_QUERIES,
    TOKEN,
    Query,
)
from tests.requests_support import insert_requests


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("dashboards")
    records = lab_records()
    with ExitStack() as exits:
        pg_url = exits.enter_context(pg_database())
        source = CaptureSource(records, speed=1.0)
        exits.callback(source.close)
        writer = StoreWriter(open_store(pg_url), StoreSettings())
        close_writer = once(writer.close)
        exits.callback(close_writer)
        collector = Collector(
            replica_streams(REPLICA, source.endpoint, source.replay_endpoint),
            settings=CollectorSettings(replay_timeout_s=2.0),
            sink=writer,
        )
        collector.start()
        stop_collector = once(collector.stop)
        exits.callback(stop_collector)
        vllm = LabVllm()
        exits.callback(vllm.close)
        settings = ApiSettings(api_token=TOKEN, replica_urls={REPLICA: vllm.url})
        api = serve_app(create_app(ApiData(collector, writer.engine, writer), settings), exits)
        deadline = time.monotonic() + 30
        while httpx.get(api + "/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the API never got ready"
            time.sleep(0.1)
        prom_url = start_prometheus(folder, api, vllm.url, exits)
        start = time.time()
        response = httpx.post(
            api + f"/replicas/{REPLICA}/reset",
            params={"mode": "keep"},
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert response.json()["outcome"] == "success", response.text
        source.play()
        assert source.done.wait(PLAY_S * 4), "the capture did not play"
        last = records[-1].seq
        deadline = time.monotonic() + 30
        while True:
            with collector.lock:
                ingest = next(iter(collector.ingests.values()))
                if ingest.last_seq == last:
                    break
            assert time.monotonic() < deadline, "the collector did not catch up"
            time.sleep(0.05)
        assert writer.flush(60)
        time.sleep(4 * SCRAPE_S)  # a few scrapes of the final state
        end = time.time()
        # kvscope stops at the end of the recording: the writer writes the recoveries it was
        # still following (a live collector writes each when its 300 s window ends).
        stop_collector()
        close_writer()
        insert_requests(writer.engine)
        with writer.engine.connect() as conn:
            first = conn.execute(text("SELECT min(min_ts) FROM log_chunks")).scalar_one()
        span = (int(first) - 600, int(time.time()) + 600)
        yield Stack(prom_url, api, writer.engine, start, end, span)


# --- every query, against the real thing --------------------------------------------------------
def test_the_stack_saw_what_the_dashboards_show(stack: Stack) -> None:
    ups = stack.prom("/api/v1/query", query="up")["result"]
    assert {(s["metric"]["job"], s["value"][1]) for s in ups} == {("kvscope", "1"), ("vllm", "1")}
    columns, rows = stack.sql("SELECT count(*), count(DISTINCT reason) FROM resets")
    assert rows[0][0] == 2  # the preempt and keep-running resets; vLLM refused the first
    _, rows = stack.sql("SELECT kind FROM intervals WHERE kind = 'degraded'")
    assert rows, "the undecodable batch left a degraded interval"
    _, rows = stack.sql("SELECT count(*) FROM resets WHERE recovery_until_ts IS NULL")
    assert rows == [(0,)]


@pytest.mark.parametrize("query", PROM_QUERIES, ids=lambda q: q.id)
def test_promql_runs_on_prometheus(stack: Stack, query: Query) -> None:
    variables = stack.variables(query.dashboard)
    expr = interpolate(query.text, variables, "prom", stack.span)
    if query.where == "variable":
        assert all(values for values, _ in variables.values()), variables
        return
    data = stack.prom(
        "/api/v1/query_range", query=expr, start=stack.start, end=stack.end, step=f"{SCRAPE_S}s"
    )
    assert data["resultType"] == "matrix", data
    series = data["result"]
    assert series, f"no series for {expr}"
    values = [float(v) for s in series for _, v in s["values"]]
    assert any(math.isfinite(v) for v in values), f"only NaN for {expr}"
    assert query.target is not None
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", query.target["legendFormat"]):
        assert all(label in s["metric"] for s in series), (label, expr)
    legends = {t["legendFormat"] for t in query.owner["targets"]}
    for o in query.owner["fieldConfig"]["overrides"]:
        assert o["matcher"]["options"] in legends, o


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _referenced_fields(panel: Json) -> set[str]:
    names = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]}
    for t in panel.get("transformations", []):
        names |= set(t["options"].get("excludeByName", {}))
        names |= set(t["options"].get("fields", []))
    for link in panel["fieldConfig"]["defaults"].get("links", []):
        names |= set(re.findall(r"\$\{__data\.fields\.(\w+)\}", link["url"]))
    if "xField" in panel["options"]:
        names.add(panel["options"]["xField"])
    return names


@pytest.mark.parametrize("query", SQL_QUERIES, ids=lambda q: q.id)
def test_sql_runs_on_the_store(stack: Stack, query: Query) -> None:
    """For each value the user may pick (every reset in the explorer), the query runs, returns
    rows, and has the shape its panel reads."""
    numbers = False
    picks = stack.picks(query.dashboard) if query.where != "variable" else [()]
    assert picks
    for pick in picks:
        variables = stack.variables(query.dashboard, pick)
        columns, rows = stack.sql(interpolate(query.text, variables, "sql", stack.span))
        assert rows, f"no rows: {query.id} with {pick}"
        numbers |= check_shape(query, columns, rows)
    assert numbers or query.where != "panel" or query.owner["type"] == "table", query.id


def check_shape(query: Query, columns: list[str], rows: list[tuple[Any, ...]]) -> bool:
    """Asserts the rows fit what the panel, annotation or variable reads; True when a stat
    panel got a number."""
    by_name = {name: [r[i] for r in rows] for i, name in enumerate(columns)}
    if query.where == "variable":
        assert set(columns) in ({"__value", "__text"}, {columns[0]}), columns
        return False
    if query.where == "annotation":
        assert {"time", "text"} <= set(columns) <= {"time", "timeend", "text", "tags"}, columns
        assert all(isinstance(t, datetime) for t in by_name["time"])
        assert all(isinstance(t, datetime) for t in by_name.get("timeend", []))
        assert all(isinstance(t, str) and t for t in by_name["text"])
        if query.owner["name"] in ("Resets", "This reset", "Other resets"):
            assert all("mode " in t and ", request " in t for t in by_name["text"]), by_name
        return False
    panel = query.owner
    assert query.target is not None
    missing = _referenced_fields(panel) - set(columns)
    assert not missing, f"{query.id} refers to {missing}, not in {columns}"
    if query.target["format"] == "time_series":
        assert all(isinstance(t, datetime) for t in by_name["time"])
        assert by_name["time"] == sorted(by_name["time"])
    if panel["type"] == "stat":
        assert len(rows) == 1, rows
        assert all(v is None or _is_number(v) for v in rows[0]), rows
        return any(_is_number(v) for v in rows[0])
    if panel["type"] == "trend":
        x = panel["options"]["xField"]
        assert all(_is_number(v) for v in by_name[x]), by_name[x]
        values = [c for c in columns if c != x and all(_is_number(v) for v in by_name[c])]
        assert values, columns
        partitions = [
            f for t in panel.get("transformations", []) for f in t["options"].get("fields", [])
        ]
        groups: dict[tuple[Any, ...], list[float]] = {}
        for r in rows:
            key = tuple(r[columns.index(f)] for f in partitions)
            groups.setdefault(key, []).append(float(r[columns.index(x)]))
        for xs in groups.values():
            assert xs == sorted(xs), f"{query.id}: x must ascend per series"
        if partitions:
            assert len(groups) >= 2, f"{query.id}: overlay of one reset"
        return True
    assert panel["type"] == "table", panel["type"]
    return False
