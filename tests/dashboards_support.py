"""Shared by the dashboard tests (test_dashboards_*.py): schemas, dashboards, every query.
The Grafana dashboards: current, well formed, and every query runs against the real thing.

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
from dataclasses import dataclass
from pathlib import Path

from kvscope.dashboards.generate import build_all
from kvscope.dashboards.model import Json

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
