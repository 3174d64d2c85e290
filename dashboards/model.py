"""Small builders for Grafana's dashboard JSON model: each returns plain dicts, nothing more.

They only spell what every panel would otherwise repeat (data source references, grid
positions, field defaults); a dashboard module still reads as the JSON it produces.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Json = dict[str, Any]

SCHEMA_VERSION = 39
"""Grafana's dashboard schemaVersion these dashboards are written for (Grafana 10.3 and later
import them unchanged; newer versions migrate them on load)."""

PROMETHEUS: Json = {"type": "prometheus", "uid": "${prom}"}
"""The Prometheus data source chosen by the dashboard's `prom` variable."""
POSTGRES_PLUGIN = "grafana-postgresql-datasource"
"""The id of Grafana's built-in PostgreSQL data source (Grafana >= 10.4; "postgres" before)."""
POSTGRES: Json = {"type": POSTGRES_PLUGIN, "uid": "${pg}"}
"""kvscope's store, chosen by the dashboard's `pg` variable."""

GRID_WIDTH = 24


# --- queries -----------------------------------------------------------------------------------
def prom(expr: str, legend: str = "", ref: str = "A") -> Json:
    """A PromQL range query."""
    return {
        "datasource": PROMETHEUS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": True,
        "instant": False,
        "refId": ref,
    }


def sql(raw_sql: str, fmt: str = "table", ref: str = "A") -> Json:
    """A raw SQL query on the store; `fmt` is `table` or `time_series` (a `time` column)."""
    assert fmt in ("table", "time_series")
    return {
        "datasource": POSTGRES,
        "editorMode": "code",
        "format": fmt,
        "rawQuery": True,
        "rawSql": dedent_sql(raw_sql),
        "refId": ref,
    }


def dedent_sql(text: str) -> str:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)


# --- panels ------------------------------------------------------------------------------------
def panel(
    kind: str,
    title: str,
    targets: Sequence[Json],
    *,
    description: str = "",
    w: int = 12,
    h: int = 8,
    unit: str | None = None,
    decimals: int | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    custom: Json | None = None,
    options: Json | None = None,
    links: Sequence[Json] = (),
    overrides: Sequence[Json] = (),
    transformations: Sequence[Json] = (),
    defaults: Json | None = None,
) -> Json:
    """One visualization; its grid position is set by `layout`. `defaults` adds field
    defaults (color, thresholds, mappings) to those spelled by the other arguments."""
    datasources = {t["datasource"]["type"] for t in targets}
    assert len(datasources) == 1, f"{title}: one data source per panel"
    defaults = dict(defaults or {})
    if unit is not None:
        defaults["unit"] = unit
    if decimals is not None:
        defaults["decimals"] = decimals
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    if links:
        defaults["links"] = list(links)
    if custom is not None:
        defaults["custom"] = custom
    result: Json = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": targets[0]["datasource"],
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "targets": list(targets),
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "options": options if options is not None else {},
    }
    if transformations:
        result["transformations"] = list(transformations)
    return result


def timeseries(title: str, targets: Sequence[Json], **kw: Any) -> Json:
    kw.setdefault(
        "custom",
        {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 0,
            "showPoints": "never",
            "spanNulls": False,
        },
    )
    kw.setdefault("options", _LEGEND_TOOLTIP)
    return panel("timeseries", title, targets, **kw)


def trend(title: str, x_field: str, targets: Sequence[Json], **kw: Any) -> Json:
    """A line chart over a numeric x field (seconds since a reset) instead of time."""
    kw.setdefault(
        "custom",
        {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 0,
            "showPoints": "always",
            "pointSize": 4,
            "spanNulls": True,
        },
    )
    kw.setdefault("options", {"xField": x_field, **_LEGEND_TOOLTIP})
    return panel("trend", title, targets, **kw)


def stat(title: str, targets: Sequence[Json], **kw: Any) -> Json:
    kw.setdefault(
        "options",
        {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "value_and_name",
            "justifyMode": "auto",
            "orientation": "auto",
            "wideLayout": True,
            "showPercentChange": False,
            "percentChangeColorMode": "standard",
        },
    )
    kw.setdefault("h", 4)
    return panel("stat", title, targets, **kw)


def table(title: str, targets: Sequence[Json], **kw: Any) -> Json:
    kw.setdefault("options", {"showHeader": True, "cellHeight": "sm", "frameIndex": 0})
    return panel("table", title, targets, **kw)


def state_timeline(title: str, targets: Sequence[Json], **kw: Any) -> Json:
    kw.setdefault(
        "options",
        {"mergeValues": True, "showValue": "never", "rowHeight": 0.8, **_LEGEND_TOOLTIP},
    )
    return panel("state-timeline", title, targets, **kw)


_LEGEND_TOOLTIP: Json = {
    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
    "tooltip": {"mode": "multi", "sort": "desc"},
}


def row(title: str) -> Json:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": 0},
    }


def thresholds(*steps: tuple[float | None, str]) -> Json:
    """Threshold steps: the first value is None (Grafana's -Infinity)."""
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def override(field_name: str, **properties: Any) -> Json:
    return {
        "matcher": {"id": "byName", "options": field_name},
        "properties": [{"id": k, "value": v} for k, v in properties.items()],
    }


def layout(items: Iterable[Json]) -> list[Json]:
    """Ids in order and grid positions left to right, a new line when a panel does not fit."""
    placed: list[Json] = []
    x = y = line_height = 0
    for number, item in enumerate(items, start=1):
        pos = item["gridPos"]
        if item["type"] == "row" or x + pos["w"] > GRID_WIDTH:
            x, y, line_height = 0, y + line_height, 0
        pos["x"], pos["y"] = x, y
        item["id"] = number
        x += pos["w"]
        line_height = max(line_height, pos["h"])
        if item["type"] == "row":
            x, y, line_height = 0, y + pos["h"], 0
        placed.append(item)
    return placed


# --- variables, annotations, the dashboard ------------------------------------------------------
def datasource_variable(name: str, label: str, plugin: str) -> Json:
    return {
        "type": "datasource",
        "name": name,
        "label": label,
        "query": plugin,
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "multi": False,
        "includeAll": False,
        "options": [],
        "skipUrlSync": False,
    }


def query_variable(
    name: str,
    label: str,
    datasource: Json,
    query: str,
    *,
    multi: bool = False,
    include_all: bool = False,
    hide: int = 0,
    sort: int = 1,
    description: str = "",
) -> Json:
    """Values from a query: PromQL's label_values(...) or SQL (`__value` / `__text` columns)."""
    return {
        "type": "query",
        "name": name,
        "label": label,
        "description": description,
        "datasource": datasource,
        "query": dedent_sql(query),
        "definition": dedent_sql(query),
        "refresh": 2,
        "regex": "",
        "sort": sort,
        "multi": multi,
        "includeAll": include_all,
        "hide": hide,
        "options": [],
        "skipUrlSync": False,
    }


def sql_annotation(name: str, color: str, raw_sql: str, enable: bool = True) -> Json:
    """Events from the store: columns `time`, optional `timeend`, `text`, `tags`.

    Grafana's schema requires the built-in source's fields in every annotation target (limit,
    matchAny, tags, type: its defaults here, as Grafana writes them); the SQL source ignores
    them."""
    target = {
        **sql(raw_sql),
        "refId": "Anno",
        "limit": 100,
        "matchAny": False,
        "tags": [],
        "type": "dashboard",
    }
    return {
        "name": name,
        "datasource": POSTGRES,
        "enable": enable,
        "hide": False,
        "iconColor": color,
        "target": target,
    }


BUILT_IN_ANNOTATIONS: Json = {
    "name": "Annotations & Alerts",
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "builtIn": 1,
    "type": "dashboard",
}


def dashboard(
    *,
    uid: str,
    title: str,
    description: str,
    panels: Iterable[Json],
    variables: Sequence[Json],
    annotations: Sequence[Json] = (),
    links: Sequence[Json] = (),
    time_from: str = "now-1h",
    refresh: str = "30s",
) -> Json:
    assert len(uid) <= 40
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["kvscope"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": time_from, "to": "now"},
        "refresh": refresh,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "links": [
            {
                "title": "kvscope",
                "type": "dashboards",
                "tags": ["kvscope"],
                "asDropdown": True,
                "icon": "external link",
                "tooltip": "",
                "url": "",
                "targetBlank": False,
                "includeVars": False,
                "keepTime": True,
            },
            *links,
        ],
        "annotations": {"list": [BUILT_IN_ANNOTATIONS, *annotations]},
        "templating": {"list": list(variables)},
        "panels": layout(panels),
    }


def link(title: str, url: str, tooltip: str = "") -> Json:
    """A dashboard link to a URL (variables in it are interpolated by Grafana)."""
    return {
        "title": title,
        "type": "link",
        "url": url,
        "tooltip": tooltip,
        "icon": "dashboard",
        "tags": [],
        "asDropdown": False,
        "targetBlank": False,
        "includeVars": False,
        "keepTime": False,
    }
