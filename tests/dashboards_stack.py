"""The live stack the dashboard queries run on: Grafana's interpolation, PostgreSQL, a lab vLLM,
Prometheus, the collector and the API."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.dashboards.model import Json
from kvscope.demo_sources import bundled
from kvscope.lab.ports import free_port
from tests.conftest import PG_ADMIN_URL
from tests.dashboards_support import CORRUPT_SEQ, PLAY_S, RATE_INTERVAL, REPLICA, SCRAPE_S


# --- Grafana's interpolation, as far as these dashboards use it ---------------------------------
def _prom_format(values: list[str], multi: bool) -> str:
    if not multi:
        return values[0]
    escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _sql_format(values: list[str], multi: bool) -> str:
    if not multi:
        return values[0].replace("'", "''")
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def interpolate(
    query: str, variables: dict[str, tuple[list[str], bool]], flavor: str, span: tuple[int, int]
) -> str:
    """Grafana's substitution: macros first (SQL), then $var / ${var} with the data source's
    formatting of multi-valued variables."""
    start, end = span
    if flavor == "sql":
        query = re.sub(r"\$__unixEpochFilter\(([^)]+)\)", rf"\1 >= {start} AND \1 <= {end}", query)
        query = query.replace("$__unixEpochFrom()", str(start)).replace(
            "$__unixEpochTo()", str(end)
        )
    else:
        query = query.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", "1s")
    fmt = _sql_format if flavor == "sql" else _prom_format

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        values, multi = variables[name]
        assert values, f"variable {name} has no value"
        return fmt(values, multi)

    query = re.sub(r"\$\{(\w+)\}|\$(\w+)", value, query)
    assert "$" not in query, query
    return query


# --- the stack: PostgreSQL store, live collector + API, a lab replica, Prometheus ---------------
@contextmanager
def pg_database() -> Iterator[str]:
    """A fresh database on the real PostgreSQL (as the `pg_url` fixture, for a whole module)."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"kvscope_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def lab_records() -> list[CaptureRecord]:
    """The bundled capture, paced over PLAY_S seconds, one payload not msgpack."""
    records = list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))
    step = PLAY_S / len(records)
    return [
        CaptureRecord(
            i * step,
            r.topic,
            r.seq_frame,
            b"\xc1 not msgpack" if r.seq == CORRUPT_SEQ else r.payload,
        )
        for i, r in enumerate(records)
    ]


class LabVllm:
    """A lab replica: vLLM's real scheduler under load, so /metrics is vLLM's own (its
    PrometheusStatLogger) and POST /reset_prefix_cache really resets (here: keep-running)."""

    def __init__(self) -> None:
        from kvscope.lab.replica import LabReplica

        self.replica = LabReplica(name=REPLICA, speed=10.0, replay_port=None, http_port=0)
        self.replica.start()
        assert self.replica.http_url is not None
        self.url = self.replica.http_url

    def close(self) -> None:
        self.replica.close()


def serve_app(app: FastAPI, exits: ExitStack) -> str:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    exits.callback(thread.join, 10)
    exits.callback(setattr, server, "should_exit", True)
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}"


def start_prometheus(folder: Path, api: str, vllm: str, exits: ExitStack) -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("no prometheus binary: run scripts/install-test-services.sh")
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_S}s",
            "scrape_timeout": f"{SCRAPE_S}s",
            "evaluation_interval": f"{SCRAPE_S}s",
        },
        "scrape_configs": [
            {"job_name": "kvscope", "static_configs": [{"targets": [api.removeprefix("http://")]}]},
            {
                "job_name": "vllm",
                "static_configs": [
                    {"targets": [vllm.removeprefix("http://")], "labels": {"replica": REPLICA}}
                ],
            },
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    exits.callback(log.close)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    exits.callback(stop)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (folder / "prometheus.log").read_text()
        try:
            if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "prometheus did not get ready"
        time.sleep(0.1)


def once(action: Callable[[], None]) -> Callable[[], None]:
    done = threading.Event()

    def run() -> None:
        if not done.is_set():
            done.set()
            action()

    return run


@dataclass
class Stack:
    prom_url: str
    api_url: str
    engine: Engine
    start: float
    end: float
    span: tuple[int, int]
    """The store's time range to query: [first batch - 10 min, now + 10 min] (Unix s)."""
    _variables: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, tuple[list[str], bool]]] = (
        field(default_factory=dict)
    )

    def prom(self, path: str, **params: Any) -> Any:
        response = httpx.get(self.prom_url + path, params=params, timeout=30)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", body
        return body["data"]

    def sql(self, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Raw SQL as Grafana's PostgreSQL data source sends it (no parameters)."""
        conn = self.engine.raw_connection()
        try:
            cursor = conn.cursor()
            cursor.execute(query)
            columns = [c[0] for c in cursor.description or []]
            rows = [tuple(r) for r in cursor.fetchall()]
            conn.rollback()
        finally:
            conn.close()
        return columns, rows

    def variables(
        self, dashboard: Json, pick: tuple[tuple[str, str], ...] = ()
    ) -> dict[str, tuple[list[str], bool]]:
        """Each query variable's values in order, as Grafana resolves them: every value of a
        multi-valued one (All), the first of a single-valued one unless `pick` names another
        (the variables after it are resolved with that choice)."""
        key = (dashboard["uid"], pick)
        if key in self._variables:
            return self._variables[key]
        chosen = dict(pick)
        resolved: dict[str, tuple[list[str], bool]] = {}
        for v in dashboard["templating"]["list"]:
            if v["type"] != "query":
                continue
            multi = bool(v.get("multi") or v.get("includeAll"))
            if v["datasource"]["type"] == "prometheus":
                query = interpolate(v["query"], resolved, "prom", self.span)
                found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
                assert found, query
                values = self.prom(
                    f"/api/v1/label/{found.group(2)}/values", **{"match[]": found.group(1)}
                )
                values = sorted(values)
            else:
                columns, rows = self.sql(interpolate(v["query"], resolved, "sql", self.span))
                at = columns.index("__value") if "__value" in columns else 0
                values = [str(r[at]) for r in rows]
            if not multi:
                values = [chosen[v["name"]]] if v["name"] in chosen else values[:1]
            resolved[v["name"]] = (values, multi)
        self._variables[key] = resolved
        return resolved

    def picks(self, dashboard: Json) -> list[tuple[tuple[str, str], ...]]:
        """Every value of each single-valued variable the user picks (hidden ones follow)."""
        everything = self.variables(dashboard, ())
        all_values = {
            v["name"]: self._all_values(dashboard, v["name"])
            for v in dashboard["templating"]["list"]
            if v["type"] == "query"
            and not (v.get("multi") or v.get("includeAll"))
            and v.get("hide", 0) != 2
        }
        assert all(everything[name][0] for name in all_values)
        return [((name, value),) for name, values in all_values.items() for value in values] or [()]

    def _all_values(self, dashboard: Json, name: str) -> list[str]:
        resolved: dict[str, tuple[list[str], bool]] = {}
        for v in dashboard["templating"]["list"]:
            if v["type"] != "query":
                continue
            if v["name"] == name:
                columns, rows = self.sql(interpolate(v["query"], resolved, "sql", self.span))
                at = columns.index("__value") if "__value" in columns else 0
                return [str(r[at]) for r in rows]
            resolved[v["name"]] = self.variables(dashboard)[v["name"]]
        raise KeyError(name)
