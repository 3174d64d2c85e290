"""What the dashboards share: metric names, variables, the store's annotations, uids."""

from __future__ import annotations

from kvscope.collector.metrics import NAMES
from kvscope.dashboards.model import (
    POSTGRES_PLUGIN,
    PROMETHEUS,
    Json,
    datasource_variable,
    query_variable,
    sql_annotation,
)
from kvscope.storage.reset_links import LINK_WINDOW_S, linked_request_sql

FLEET_UID = "kvscope-fleet"
RESET_EXPLORER_UID = "kvscope-reset-explorer"
COLLECTOR_HEALTH_UID = "kvscope-collector-health"

VLLM_METRICS = frozenset(
    {
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
    }
)
"""vLLM's own metric names, as its /metrics exposes them (the same `storage/scrape.py` reads).

Prometheus must give vLLM's targets a `replica` label equal to kvscope's replica name (see
the package docstring): vLLM labels its series only with model_name and engine."""


def kv(name: str) -> str:
    """A kvscope metric name, checked against the one list (collector/metrics.py)."""
    assert name in NAMES, f"{name} is not in kvscope.collector.metrics.METRICS"
    return name


def vllm(name: str) -> str:
    assert name in VLLM_METRICS, f"{name} is not one of vLLM's metric names"
    return name


RATE = "$__rate_interval"
REPLICAS = 'replica=~"$replica"'
"""PromQL matcher for the `replica` variable (multi-valued: Grafana writes a regex)."""
SQL_REPLICAS = "s.replica IN ($replica)"
"""The same filter in SQL (Grafana writes a quoted list), on `streams s`."""


def prometheus_variable() -> Json:
    return datasource_variable("prom", "Prometheus", "prometheus")


def postgres_variable() -> Json:
    return datasource_variable("pg", "kvscope store", POSTGRES_PLUGIN)


def replica_variable() -> Json:
    return query_variable(
        "replica",
        "Replica",
        PROMETHEUS,
        f"label_values({kv('kvscope_stream_epoch')}, replica)",
        multi=True,
        include_all=True,
        description="kvscope's replica names",
    )


def linked_request(reset: str = "r", stream: str = "s") -> str:
    """A join of `reset_requests q`: the successful request through kvscope this reset followed,
    if any, by the API's own rule (`storage/reset_links.py`)."""
    return linked_request_sql(LINK_WINDOW_S, reset, stream)


def reset_text(reset: str = "r", stream: str = "s") -> str:
    """One line about a reset: where, why, mode and outcome, before, 50 % / 90 % times."""
    return f"""format(
        'reset #%s on %s/%s: %s, mode %s, request %s; before %s blocks (%s hittable); '
        || '50 %% back %s, 90 %% back %s',
        {reset}.id, {stream}.replica, {stream}.rank, {reset}.reason,
        COALESCE({reset}.mode, q.mode, 'unknown'),
        COALESCE(q.outcome || ' by ' || q.requested_by, 'none through kvscope'),
        {reset}.before_blocks, {reset}.before_hittable,
        COALESCE('after ' || round({reset}.t50_s::numeric, 1) || ' s', 'never'),
        COALESCE('after ' || round({reset}.t90_s::numeric, 1) || ' s', 'never'))"""


def resets_annotation(where: str = SQL_REPLICAS, name: str = "Resets") -> Json:
    return sql_annotation(
        name,
        "red",
        f"""
        SELECT to_timestamp(r.ts) AS "time",
               {reset_text()} AS text,
               s.replica || ',' || r.reason || ',' || COALESCE(r.mode, q.mode, 'unknown') AS tags
        FROM resets r
        JOIN streams s ON s.id = r.stream_id{linked_request()}
        WHERE $__unixEpochFilter(r.ts) AND {where}
        ORDER BY r.ts
        """,
    )


def requests_annotation(where: str = "q.replica IN ($replica)") -> Json:
    return sql_annotation(
        "Reset requests",
        "orange",
        f"""
        SELECT to_timestamp(q.requested_at) AS "time",
               format('reset requested on %s: mode %s%s, %s%s (by %s)%s',
                      q.replica, q.mode, CASE WHEN q.external THEN ' (external too)' ELSE '' END,
                      q.outcome, COALESCE(' HTTP ' || q.http_status, ''), q.requested_by,
                      COALESCE(': ' || q.detail, '')) AS text,
               q.replica || ',request,' || q.mode || ',' || q.outcome AS tags
        FROM reset_requests q
        WHERE $__unixEpochFilter(q.requested_at) AND {where}
        ORDER BY q.requested_at
        """,
    )


def intervals_annotation(where: str = SQL_REPLICAS) -> Json:
    return sql_annotation(
        "Degraded / incomplete",
        "purple",
        f"""
        SELECT to_timestamp(i.from_ts) AS "time",
               to_timestamp(COALESCE(i.to_ts, $__unixEpochTo())) AS timeend,
               format('%s/%s %s%s', s.replica, s.rank, i.kind, COALESCE(': ' || i.detail, ''))
                 AS text,
               s.replica || ',' || i.kind AS tags
        FROM intervals i
        JOIN streams s ON s.id = i.stream_id
        WHERE i.kind IN ('degraded', 'incomplete')
          AND i.from_ts <= $__unixEpochTo()
          AND COALESCE(i.to_ts, $__unixEpochTo()) >= $__unixEpochFrom()
          AND {where}
        ORDER BY i.from_ts
        """,
    )


def explorer_url(reset_id: str, from_ms: str, to_ms: str) -> str:
    return (
        f"/d/{RESET_EXPLORER_UID}/kvscope-reset-explorer?var-reset={reset_id}"
        f"&var-compare={reset_id}&from={from_ms}&to={to_ms}&${{prom:queryparam}}&${{pg:queryparam}}"
    )


AROUND_BEFORE_S = 300
AROUND_AFTER_S = 600
"""The explorer's time range around a reset: 5 minutes before, 10 after."""
