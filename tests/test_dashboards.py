"""The Grafana dashboards: current, well formed, and every query runs against the real thing.

- The committed JSON is what the Python data generates. It validates against Grafana's own
  dashboard schema, and each panel's options and custom field config against its plugin's
  schema (`dashboards/schema/grafana-*.schema.json`, generated from the npm package
  @grafana/schema by `scripts/grafana-schema.sh`; see SOURCE.md there), and against kvscope's
  stricter `dashboard.schema.json` where Grafana's leaves things open.
- Every PromQL query (panels and variables) runs on a real Prometheus server (Debian's
  `prometheus`, started here on a free loopback port) that scrapes a live kvscope API (the
  collector fed by the bundled capture through real ZMQ sockets, its store on the real
  PostgreSQL) and a lab replica's /metrics: vLLM's real scheduler under load, its metrics
  written by vLLM's own PrometheusStatLogger (kvscope.lab).
- Every SQL query (panels, annotations, variables) runs on that PostgreSQL store, filled by the
  live ingest (StoreWriter), with Grafana's variables and macros substituted as Grafana does.
- No Grafana server can be installed here: `push` is tested against a stdlib HTTP server that
  records the requests and answers as Grafana's HTTP API does (folders, dashboards/db).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.metrics import NAMES
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.dashboards.cli import dashboards_app
from kvscope.dashboards.common import LINK_WINDOW_S, VLLM_METRICS, linked_request
from kvscope.dashboards.generate import JSON_DIR, PROVISIONING_FILE, build_all, rendered
from kvscope.dashboards.model import Json
from kvscope.dashboards.push import push
from kvscope.demo import _bundled
from kvscope.lab.ports import free_port
from kvscope.storage import schema, scrape
from kvscope.storage.engine import open_store
from kvscope.storage.reset_links import clears_by_request
from kvscope.storage.writer import StoreSettings, StoreWriter
from tests.conftest import PG_ADMIN_URL, collector_time

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = ROOT / "dashboards" / "schema"
SCHEMA = json.loads((SCHEMA_DIR / "dashboard.schema.json").read_text())
GRAFANA_SCHEMA = json.loads((SCHEMA_DIR / "grafana-dashboard.schema.json").read_text())
GRAFANA_PANEL_SCHEMAS = {
    p.name.removeprefix("grafana-panel-").removesuffix(".schema.json"): json.loads(p.read_text())
    for p in SCHEMA_DIR.glob("grafana-panel-*.schema.json")
}
"""Panel type id -> its plugin's schema: definitions `Options` and (not every plugin has
custom field config) `FieldConfig`."""
DASHBOARDS = build_all()
TOKEN = "grafana-test-token"
REPLICA = "lab"
CORRUPT_SEQ = 700
"""A batch replaced by bytes that are not msgpack: a malformed frame, and a degraded interval
until the preempt reset's clear (seq ~1055)."""
PLAY_S = 8.0
SCRAPE_S = 1
RATE_INTERVAL = "4s"
"""Grafana's $__rate_interval at a 1 s scrape interval: max($__interval + scrape, 4 x scrape)."""


# --- the dashboards' queries --------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    dashboard: Json
    where: str
    """panel / annotation / variable"""
    owner: Json
    target: Json | None
    """None for a variable (its `query` is the query)."""

    @property
    def text(self) -> str:
        if self.target is None:
            return str(self.owner["query"])
        return str(self.target.get("expr") or self.target["rawSql"])

    @property
    def source(self) -> str:
        ref = self.target["datasource"] if self.target else self.owner["datasource"]
        return str(ref["type"])

    @property
    def id(self) -> str:
        name = self.owner.get("title") or self.owner["name"]
        ref = f"/{self.target['refId']}" if self.target and self.where == "panel" else ""
        return f"{self.dashboard['uid'].removeprefix('kvscope-')}/{self.where}:{name}{ref}"


def all_queries() -> list[Query]:
    found = []
    for d in DASHBOARDS:
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                found.append(Query(d, "variable", v, None))
        for a in d["annotations"]["list"]:
            if "target" in a:
                found.append(Query(d, "annotation", a, a["target"]))
        for p in d["panels"]:
            for t in p.get("targets", []):
                found.append(Query(d, "panel", p, t))
    return found


QUERIES = all_queries()
PROM_QUERIES = [q for q in QUERIES if q.source == "prometheus"]
SQL_QUERIES = [q for q in QUERIES if q.source == "grafana-postgresql-datasource"]


# --- generated files, schema, names -------------------------------------------------------------
def test_committed_json_is_current() -> None:
    """Regenerate and compare: `python -m kvscope.dashboards.generate` after editing."""
    committed = {p.name: p.read_text(encoding="utf-8") for p in JSON_DIR.glob("*.json")}
    expected = rendered()
    assert sorted(committed) == sorted(expected), "run python -m kvscope.dashboards.generate"
    for name, content in expected.items():
        assert committed[name] == content, f"{name} is stale: python -m kvscope.dashboards.generate"


def _errors(schema: Json, instance: Any, definition: str | None = None, at: str = "") -> list[str]:
    """Every validation error, as `path: message` (the path after `at`), in the schema's own
    draft (the generated ones are draft-07). `definition`: validate against that definition
    instead of the root. An error of an `anyOf` (a panel is a Panel or a RowPanel) is told by
    those of its branches."""
    if definition is not None:
        schema = {**schema, "$ref": f"#/definitions/{definition}"}
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)

    def leaves(errors: Iterable[jsonschema.ValidationError]) -> Iterator[str]:
        for e in errors:
            if e.context:
                yield from leaves(e.context)
            else:
                path = "/".join(str(x) for x in [at, *e.absolute_path] if x != "")
                yield f"{path}: {e.message}"

    return list(leaves(validator(schema).iter_errors(instance)))


def grafana_errors(dashboard: Json) -> list[str]:
    """Errors against Grafana's dashboard schema, then each panel's options and custom field
    config against its plugin's schema (Grafana's dashboard schema leaves both open)."""
    errors = _errors(GRAFANA_SCHEMA, dashboard)
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            continue
        where = f"panels/{p.get('id')} ({p.get('type')})"
        plugin = GRAFANA_PANEL_SCHEMAS.get(p.get("type"))
        if plugin is None:
            errors.append(f"{where}: no schema for this panel type: add it to "
                          "scripts/grafana-schema.sh and run it")  # fmt: skip
            continue
        errors += _errors(plugin, p.get("options"), "Options", f"{where}/options")
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is None:
            continue
        if "FieldConfig" not in plugin["definitions"]:
            errors.append(f"{where}: custom field config, but the plugin has none")
            continue
        errors += _errors(plugin, custom, "FieldConfig", f"{where}/fieldConfig/defaults/custom")
    return errors


@pytest.mark.parametrize("path", sorted(JSON_DIR.glob("*.json")), ids=lambda p: p.name)
def test_json_validates_against_grafanas_schema(path: Path) -> None:
    """Grafana's dashboard model, and every panel's options against its plugin's."""
    dashboard = json.loads(path.read_text())
    assert grafana_errors(dashboard) == []


def test_grafanas_schema_fails_a_broken_dashboard() -> None:
    good = json.loads(json.dumps(DASHBOARDS[0]))
    assert grafana_errors(good) == []
    panel = next(i for i, p in enumerate(good["panels"]) if p["type"] == "timeseries")
    for spoil, expected in (
        (lambda d: d["panels"][panel].update(gridPos="0 0 12 8"), "gridPos: '0 0 12 8' is not"),
        (lambda d: d["panels"][panel]["gridPos"].pop("w"), "gridPos: 'w' is a required"),
        (lambda d: d["panels"][panel].update(titel="typo"), "'titel' was unexpected"),
        (lambda d: d.update(refresh=30), "refresh: 30 is not of type 'string'"),
        (lambda d: d["templating"]["list"][0].update(type="dropdown"), "'dropdown' is not one"),
        (lambda d: d["annotations"]["list"][1]["target"].pop("limit"), "'limit' is a required"),
        (lambda d: d.pop("schemaVersion"), "'schemaVersion' is a required"),
        # What only the panel plugins' schemas know:
        (lambda d: d["panels"][panel]["options"]["legend"].update(placement="top"),
         "options/legend/placement: 'top' is not one of"),
        (lambda d: d["panels"][panel]["options"].pop("tooltip"), "'tooltip' is a required"),
        (lambda d: d["panels"][panel]["fieldConfig"]["defaults"]["custom"].update(
            drawStyle="dots"), "custom/drawStyle: 'dots' is not one of"),
        (lambda d: d["panels"][panel].update(type="radar"), "no schema for this panel type"),
    ):  # fmt: skip
        bad = json.loads(json.dumps(good))
        spoil(bad)
        errors = grafana_errors(bad)
        assert any(expected in e for e in errors), (expected, errors)


@pytest.mark.parametrize("path", sorted(JSON_DIR.glob("*.json")), ids=lambda p: p.name)
def test_json_validates_against_the_dashboard_schema(path: Path) -> None:
    """kvscope's own, stricter schema (see test_the_schema_is_strict for what it adds)."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    dashboard = json.loads(path.read_text())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(dashboard)
    ]
    assert errors == []
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert len(set(names)) == len(names)


def test_the_schema_is_strict() -> None:
    """kvscope's schema fails what Grafana's lets through: it is kept for those."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    good = json.loads(json.dumps(DASHBOARDS[0]))
    assert validator.is_valid(good)
    for spoil, grafana_sees_it in (
        (lambda d: d["panels"][1].update(titel="typo"), True),
        (lambda d: d["templating"]["list"][0].update(type="dropdown"), True),
        (lambda d: d.pop("schemaVersion"), True),
        # Grafana's schema leaves these open (targets, annotation targets, variables) or
        # loses them in its TypeScript (the grid's bounds):
        (lambda d: d["panels"][1]["targets"][0].update(exprr="up"), False),
        (lambda d: d["panels"][1]["targets"][0].pop("expr"), False),
        (lambda d: d["panels"][1]["gridPos"].update(w=25), False),
        (lambda d: d["annotations"]["list"][1]["target"].pop("rawSql"), False),
        (lambda d: d["templating"]["list"][1].update(qurey="up"), False),
        (lambda d: d.pop("uid"), False),
    ):
        bad = json.loads(json.dumps(good))
        spoil(bad)
        assert not validator.is_valid(bad)
        assert bool(grafana_errors(bad)) == grafana_sees_it


_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                 "or", "unless", "offset", "inf", "nan"}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in an expression: identifiers that are not functions, keywords, labels in
    matchers or grouping clauses, strings, or durations. A variable's label_values(selector,
    label) names the selector's metric."""
    variable = re.fullmatch(r"label_values\((.+),\s*\w+\)", expr.strip())
    if variable:
        expr = variable.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range durations
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?", expr):
        word = match.group(0).rstrip("( ")
        if match.group(1) or word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def test_every_promql_metric_name_is_kvscopes_or_vllms() -> None:
    assert set(scrape._FIELDS) | {scrape._TTFT_BUCKET} == VLLM_METRICS
    used: set[str] = set()
    for q in PROM_QUERIES:
        names = promql_metric_names(q.text)
        assert names, q.id
        assert names <= NAMES | VLLM_METRICS, (q.id, names - NAMES - VLLM_METRICS)
        used |= names
    assert promql_metric_names('sum by (a) (rate(x_total{b="c"}[5m])) / on (a) y') == {
        "x_total",
        "y",
    }
    # Every kvscope metric is on some dashboard.
    assert NAMES - used == set()


def test_panels_each_have_queries_of_one_known_source() -> None:
    for d in DASHBOARDS:
        for p in d["panels"]:
            if p["type"] == "row":
                continue
            assert p["targets"], p["title"]
            assert {t["datasource"]["type"] for t in p["targets"]} == {p["datasource"]["type"]}
    assert len(PROM_QUERIES) + len(SQL_QUERIES) == len(QUERIES)


def test_links_name_real_variables_and_dashboards() -> None:
    uids = {d["uid"] for d in DASHBOARDS}
    variables = {d["uid"]: {v["name"] for v in d["templating"]["list"]} for d in DASHBOARDS}
    urls = [
        link["url"]
        for d in DASHBOARDS
        for link in [*d["links"]] + [
            x for p in d["panels"] for x in p.get("fieldConfig", {}).get("defaults", {}).get(
                "links", [])
        ]
        if link.get("url")
    ]  # fmt: skip
    assert urls
    for url in urls:
        uid = re.match(r"^/d/([^/]+)/", url)
        assert uid and uid.group(1) in uids, url
        for name in re.findall(r"var-(\w+)=", url):
            assert name in variables[uid.group(1)], url
        for name in re.findall(r"\$\{(\w+)(?::\w+)?\}", url):
            assert name in set().union(*variables.values()), url


# --- which request a reset followed: the API's rule, in SQL ------------------------------------
def test_the_dashboards_link_resets_to_requests_as_the_api_does(store_url: str) -> None:
    """The dashboards' join (`linked_request`) picks, for every clear, the request that
    `storage/reset_links.py` (GET /resets, the demo, the report) picks, here where the engine's
    clock (`ts`) and the collector's (`recv_ts`) disagree, as a lab's simulated clock does."""
    t, window = 1_800_000_000.0, LINK_WINDOW_S
    engine = open_store(store_url)
    with engine.begin() as conn:
        lab, other = (
            conn.execute(insert(schema.streams).values(replica=n, rank=0)).inserted_primary_key[0]
            for n in ("lab", "other")
        )
        for replica, at, outcome in [
            ("lab", t, "success"),  # 1
            ("lab", t + 1000, "success"),  # 2
            ("lab", t + 1000, "success"),  # 3: at the same instant as 2, recorded after it
            ("lab", t + 1005, "refused"),  # 4: made no clear
            ("lab", t + 3000, "success"),  # 5
            ("other", t + 5000, "success"),  # 6
        ]:
            conn.execute(
                insert(schema.reset_requests).values(
                    replica=replica, requested_at=at, requested_by="t", mode="keep",
                    external=False, outcome=outcome, http_status=200, detail="",
                )
            )  # fmt: skip
        for stream, seq, ts, recv_ts, reason in [
            (lab, 1, t + 1, t + window + 400, "all_blocks_cleared"),  # arrived too late
            (lab, 2, t + 9999, t + 1010, "all_blocks_cleared"),  # engine clock far ahead
            (lab, 3, t + 1000 + window, None, "all_blocks_cleared"),  # by ts, at the window's end
            (lab, 4, t + 3001, t + 3002, "restart"),  # not what a request made
            (lab, 5, t + 3010, t + 2999, "all_blocks_cleared"),  # arrived before request 5
            (other, 6, t + 5001, t + 5001, "all_blocks_cleared"),
            (lab, 7, t + 5001, t + 5001, "all_blocks_cleared"),  # request 6 is other's
        ]:
            conn.execute(
                insert(schema.resets).values(
                    stream_id=stream, epoch=0, seq=seq, ts=ts, recv_ts=recv_ts, reason=reason,
                    degraded=False, before_blocks=1, before_hittable=1, before_orphans=0,
                    before_tokens=16, before=b"",
                )
            )  # fmt: skip
    with engine.connect() as conn:
        join = f"FROM resets r JOIN streams s ON s.id = r.stream_id{linked_request()}"
        query = f"SELECT r.id, q.id {join}"
        dashboards = {c: q for c, q in conn.execute(text(query))}
        api = {c: q for q, cs in clears_by_request(conn, window).items() for c in cs}
    engine.dispose()
    expected = {1: None, 2: 3, 3: 3, 4: None, 5: None, 6: 6, 7: None}
    assert dashboards == {c: api.get(c) for c in dashboards} == expected


def test_the_dashboards_read_requests_only_through_the_link() -> None:
    """No panel repeats the rule in its own words: a query reads `reset_requests` through
    `linked_request`, or lists the requests themselves (the requests annotation)."""
    link = " ".join(linked_request().split())
    for query in SQL_QUERIES:
        words = " ".join(query.text.split())
        if (
            "reset_requests" in words
            and "FROM reset_requests q WHERE $__unixEpochFilter" not in words
        ):
            assert link in words, query.id


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
    records = list(read_capture(_bundled("lab_3rps_180s.msgpack.gz")))
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
        "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                   "evaluation_interval": f"{SCRAPE_S}s"},
        "scrape_configs": [
            {"job_name": "kvscope", "static_configs": [{"targets": [api.removeprefix("http://")]}]},
            {"job_name": "vllm", "static_configs": [
                {"targets": [vllm.removeprefix("http://")], "labels": {"replica": REPLICA}}]},
        ],
    }  # fmt: skip
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    exits.callback(log.close)
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

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
                values = self.prom(f"/api/v1/label/{found.group(2)}/values",
                                   **{"match[]": found.group(1)})  # fmt: skip
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
            if v["type"] == "query" and not (v.get("multi") or v.get("includeAll"))
            and v.get("hide", 0) != 2
        }  # fmt: skip
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


def insert_requests(engine: Engine) -> None:
    """The requests through kvscope that caused the capture's resets, as the API records them
    (POST /replicas/{replica}/reset), at their time in the recording: vLLM refused the first
    (requests were running), the preempt and keep-running ones succeeded."""
    sidecar = json.loads(_bundled("lab_3rps_180s.json").read_text())
    with engine.begin() as conn:
        for reset in sidecar["resets"]:
            conn.execute(
                insert(schema.reset_requests).values(
                    replica=REPLICA, requested_at=collector_time(conn, reset["ts"]),
                    requested_by="token@127.0.0.1", mode=reset["mode"], external=False,
                    outcome="success" if reset["result"] else "refused", http_status=200,
                    detail=json.dumps({"success": reset["result"]}),
                )
            )  # fmt: skip


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
        response = httpx.post(api + f"/replicas/{REPLICA}/reset", params={"mode": "keep"},
                              headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)  # fmt: skip
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
    data = stack.prom("/api/v1/query_range", query=expr, start=stack.start, end=stack.end,
                      step=f"{SCRAPE_S}s")  # fmt: skip
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
        partitions = [f for t in panel.get("transformations", []) for f in t["options"].get(
            "fields", [])]  # fmt: skip
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


# --- push and export ----------------------------------------------------------------------------
class FakeGrafana:
    """Answers as Grafana's HTTP API does for what push uses; records every request."""

    def __init__(self, token: str = TOKEN) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.folders: dict[str, Json] = {}
        self.dashboards: dict[str, Json] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any) -> None:
                content = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                path = self.path.split("?")[0]
                fake.requests.append((method, path, body))
                if self.headers.get("authorization") != f"Bearer {token}":
                    self._answer(401, {"message": "Unauthorized"})
                    return
                self._answer(*fake.route(method, path, body))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) == ("GET", "/api/folders"):
            return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]}
                         for f in self.folders.values()]  # fmt: skip
        if (method, path) == ("POST", "/api/folders"):
            uid = body.get("uid") or uuid.uuid4().hex[:12]
            if uid in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            if any(f["title"] == body["title"] for f in self.folders.values()):
                return 409, {"message": "a folder with the same name already exists"}
            self.folders[uid] = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"],
                                 "url": f"/dashboards/f/{uid}/", "version": 1}  # fmt: skip
            return 200, self.folders[uid]
        if (method, path) == ("POST", "/api/dashboards/db"):
            dashboard, uid = body["dashboard"], body["dashboard"].get("uid")
            if body.get("folderUid") not in self.folders:
                return 400, {"message": "folder not found"}
            old = self.dashboards.get(uid)
            if old is not None and not body.get("overwrite"):
                return 412, {"status": "name-exists", "message": "exists"}
            version = 1 if old is None else old["version"] + 1
            self.dashboards[uid] = {"dashboard": dashboard, "folderUid": body["folderUid"],
                                    "version": version}  # fmt: skip
            slug = re.sub(r"[^a-z0-9]+", "-", dashboard["title"].lower()).strip("-")
            return 200, {
                "id": list(self.dashboards).index(uid) + 1,
                "uid": uid,
                "slug": slug,
                "status": "success",
                "url": f"/d/{uid}/{slug}",
                "version": version,
            }
        return 404, {"message": "Not found"}  # fmt: skip

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()
    yield fake
    fake.close()


def test_push_creates_the_folder_once_and_overwrites_by_uid(grafana: FakeGrafana) -> None:
    first = push(grafana.url, TOKEN, "kvscope")
    assert first.folder_created and first.folder_uid == "kvscope"
    uids = [d["uid"] for d in DASHBOARDS]
    assert [uid for uid, _ in first.dashboards] == uids
    requests_first = list(grafana.requests)
    assert [(m, p) for m, p, _ in requests_first] == [
        ("GET", "/api/folders"),
        ("POST", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * len(uids),
    ]
    saved = [body for _, p, body in requests_first if p == "/api/dashboards/db"]
    assert all(b["overwrite"] is True and b["folderUid"] == "kvscope" for b in saved)
    assert [b["dashboard"] for b in saved] == DASHBOARDS

    grafana.requests.clear()
    second = push(grafana.url, TOKEN, "kvscope")
    assert not second.folder_created and second.folder_uid == "kvscope"
    assert [(m, p) for m, p, _ in grafana.requests] == [
        ("GET", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * len(uids),
    ]
    assert [b for _, p, b in grafana.requests if p == "/api/dashboards/db"] == saved
    assert set(grafana.dashboards) == set(uids) and len(grafana.folders) == 1
    assert all(d["version"] == 2 for d in grafana.dashboards.values())


def test_push_uses_a_folder_of_that_title_made_by_hand(grafana: FakeGrafana) -> None:
    grafana.folders["abc123"] = {"id": 1, "uid": "abc123", "title": "LLM serving"}
    pushed = push(grafana.url, TOKEN, "LLM serving")
    assert pushed.folder_uid == "abc123" and not pushed.folder_created
    assert all(d["folderUid"] == "abc123" for d in grafana.dashboards.values())


def test_push_command(grafana: FakeGrafana) -> None:
    runner = CliRunner()
    args = ["push", "--grafana-url", grafana.url, "--folder", "Inference caches"]
    result = runner.invoke(dashboards_app, [*args, "--token", TOKEN])
    assert result.exit_code == 0, result.output
    assert "folder 'Inference caches' (inference-caches) created" in result.output
    assert result.output.count("saved kvscope-") == len(DASHBOARDS)
    result = runner.invoke(dashboards_app, args, env={"GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 0 and "found" in result.output, result.output
    refused = runner.invoke(dashboards_app, [*args, "--token", "wrong"])
    assert refused.exit_code == 1 and "401" in refused.output, refused.output
    nobody = f"http://127.0.0.1:{free_port()}"
    unreachable = runner.invoke(dashboards_app, ["push", "--grafana-url", nobody, "--token", "t"])
    assert unreachable.exit_code == 1 and "cannot reach" in unreachable.output


def test_export_writes_the_json_and_a_provisioning_file(tmp_path: Path) -> None:
    out = tmp_path / "grafana" / "kvscope"
    result = CliRunner().invoke(dashboards_app, ["export", str(out), "--folder", "kvscope"])
    assert result.exit_code == 0, result.output
    for name, content in rendered().items():
        assert (out / name).read_text() == content
    provisioning = yaml.safe_load((out / PROVISIONING_FILE).read_text())
    assert provisioning["apiVersion"] == 1
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file" and provider["folder"] == "kvscope"
    assert provider["options"]["path"] == str(out.resolve())
    result = CliRunner().invoke(
        dashboards_app, ["export", str(out), "--grafana-path", "/var/lib/grafana/dashboards/kv"]
    )
    provisioning = yaml.safe_load((out / PROVISIONING_FILE).read_text())
    assert provisioning["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/kv"
