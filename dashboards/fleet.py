"""Fleet: each replica's cache per tier, what flows through it, its resets, the engine's view."""

from __future__ import annotations

from kvscope.dashboards.common import (
    AROUND_AFTER_S,
    AROUND_BEFORE_S,
    FLEET_UID,
    RATE,
    REPLICAS,
    SQL_REPLICAS,
    explorer_url,
    intervals_annotation,
    kv,
    linked_request,
    postgres_variable,
    prometheus_variable,
    replica_variable,
    requests_annotation,
    resets_annotation,
    vllm,
)
from kvscope.dashboards.model import (
    PROMETHEUS,
    Json,
    dashboard,
    override,
    prom,
    query_variable,
    row,
    sql,
    state_timeline,
    table,
    thresholds,
    timeseries,
)

TIERS = f'{REPLICAS}, medium=~"$tier"'


def tier_variable() -> Json:
    return query_variable(
        "tier",
        "Tier",
        PROMETHEUS,
        f"label_values({kv('kvscope_cache_blocks')}{{{REPLICAS}}}, medium)",
        multi=True,
        include_all=True,
        description="vLLM's medium: GPU, CPU, ...",
    )


def _cache_panels() -> list[Json]:
    by = "sum by (replica, medium)"
    return [
        row("Cache"),
        timeseries(
            "Stored vs hittable blocks",
            [
                prom(
                    f"{by} ({kv('kvscope_cache_blocks')}{{{TIERS}}})",
                    "{{replica}} {{medium}} stored",
                ),
                prom(
                    f"{by} ({kv('kvscope_cache_hittable_blocks')}{{{TIERS}}})",
                    "{{replica}} {{medium}} hittable",
                    "B",
                ),
            ],
            description="Distinct cached blocks per replica and tier (summed over ranks and "
            "KV-cache groups), and how many of them a prefix lookup can reach (every ancestor "
            "cached). Resets are the red marks.",
            unit="short",
            min_value=0,
        ),
        timeseries(
            "Orphan blocks",
            [
                prom(
                    f"{by} ({kv('kvscope_cache_orphan_blocks')}{{{TIERS}}})",
                    "{{replica}} {{medium}}",
                )
            ],
            description="Cached blocks whose parent is not cached: a keep-running reset, a gap "
            "or a late join leaves them; they cannot be hit until the chain is stored again.",
            unit="short",
            min_value=0,
        ),
        timeseries(
            "Blocks stored / removed per second",
            [
                prom(
                    "sum by (replica, type) "
                    f"(rate({kv('kvscope_ingest_block_events_total')}{{{REPLICAS}}}[{RATE}]))",
                    "{{replica}} {{type}}",
                )
            ],
            description="Block hashes in BlockStored and BlockRemoved events (every tier).",
            unit="ops",
            min_value=0,
        ),
        timeseries(
            "Resets requested through kvscope",
            [
                prom(
                    "sum by (replica, mode, outcome) "
                    f"(increase({kv('kvscope_resets_requested_total')}{{{REPLICAS}}}[{RATE}]))",
                    "{{replica}} {{mode}} {{outcome}}",
                )
            ],
            description="POST /replicas/{replica}/reset calls, by mode and vLLM's answer.",
            unit="short",
            min_value=0,
            custom={"drawStyle": "bars", "fillOpacity": 80, "lineWidth": 1},
        ),
    ]


def _stream_panels() -> list[Json]:
    inc = "sum by (replica) (increase({}{{" + REPLICAS + "}}[" + RATE + "]))"
    return [
        row("Streams"),
        state_timeline(
            "Degraded streams",
            [
                prom(
                    f"max by (replica, rank) ({kv('kvscope_stream_degraded')}{{{REPLICAS}}})",
                    "{{replica}}/{{rank}}",
                )
            ],
            description="1 while a stream's map is known to be incomplete (a gap the replay "
            "could not fill, an undecodable batch); the purple regions come from the store.",
            min_value=0,
            max_value=1,
            custom={"fillOpacity": 80, "lineWidth": 0},
            defaults={
                "color": {"mode": "thresholds"},
                "thresholds": thresholds((None, "green"), (1, "red")),
                "mappings": [
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "known", "color": "green"},
                            "1": {"text": "degraded", "color": "red"},
                        },
                    }
                ],
            },
        ),
        timeseries(
            "Gaps, replays, restarts",
            [
                prom(inc.format(kv("kvscope_ingest_gaps_total")), "{{replica}} gaps"),
                prom(
                    "sum by (replica, outcome) (increase("
                    f"{kv('kvscope_ingest_replays_total')}{{{REPLICAS}}}[{RATE}]))",
                    "{{replica}} replays {{outcome}}",
                    "B",
                ),
                prom(inc.format(kv("kvscope_ingest_restarts_total")), "{{replica}} restarts", "C"),
            ],
            description="Seq gaps seen, replays asked of the publisher's replay socket (ok or "
            "failed) and publisher restarts (seq went back: a new epoch with an empty map).",
            unit="short",
            min_value=0,
            custom={"drawStyle": "bars", "fillOpacity": 80, "lineWidth": 1},
        ),
    ]


def _engine_panels() -> list[Json]:
    hits = f"rate({vllm('vllm:prefix_cache_hits_total')}{{{REPLICAS}}}[{RATE}])"
    queries = f"rate({vllm('vllm:prefix_cache_queries_total')}{{{REPLICAS}}}[{RATE}])"
    return [
        row("The engine (vLLM's own /metrics)"),
        timeseries(
            "Prefix-cache hit rate",
            [prom(f"sum by (replica) ({hits}) / sum by (replica) ({queries})", "{{replica}}")],
            description="Tokens found in the prefix cache / tokens looked up, as vLLM counts "
            "them. It falls at each reset and climbs back as the cache refills.",
            unit="percentunit",
            min_value=0,
            max_value=1,
        ),
        timeseries(
            "KV cache usage",
            [
                prom(
                    f"max by (replica, engine) ({vllm('vllm:kv_cache_usage_perc')}{{{REPLICAS}}})",
                    "{{replica}} engine {{engine}}",
                )
            ],
            description="vLLM's kv_cache_usage_perc (a fraction of the GPU blocks in use).",
            unit="percentunit",
            min_value=0,
            max_value=1,
        ),
    ]


def _resets_table() -> Json:
    url = explorer_url("${__data.fields.id}", "${__data.fields.from_ms}", "${__data.fields.to_ms}")
    return table(
        "Resets in this time range",
        [
            sql(
                f"""
                SELECT r.id, to_timestamp(r.ts) AS "time", s.replica, s.rank, r.reason,
                       COALESCE(r.mode, q.mode) AS mode, q.outcome AS request, r.degraded,
                       r.before_blocks, r.before_hittable, r.before_orphans,
                       r.t50_s, r.t90_s, r.peak_orphans,
                       ((r.ts - {AROUND_BEFORE_S}) * 1000)::bigint AS from_ms,
                       ((r.ts + {AROUND_AFTER_S}) * 1000)::bigint AS to_ms
                FROM resets r
                JOIN streams s ON s.id = r.stream_id{linked_request()}
                WHERE $__unixEpochFilter(r.ts) AND {SQL_REPLICAS}
                ORDER BY r.ts DESC
                """
            )
        ],
        description="From kvscope's store. Click a row for the reset explorer around it.",
        w=24,
        h=8,
        links=[{"title": "Open in the reset explorer", "url": url}],
        overrides=[override("t50_s", unit="s"), override("t90_s", unit="s")],
        transformations=[
            {"id": "organize", "options": {"excludeByName": {"from_ms": True, "to_ms": True}}}
        ],
    )


def build() -> Json:
    return dashboard(
        uid=FLEET_UID,
        title="kvscope / Fleet",
        description="Every replica's prefix cache per tier: stored vs hittable blocks, orphans, "
        "stores and removes, resets (from kvscope's store), stream health, and vLLM's own hit "
        "rate and KV usage beside them.",
        variables=[prometheus_variable(), postgres_variable(), replica_variable(), tier_variable()],
        annotations=[resets_annotation(), requests_annotation(), intervals_annotation()],
        panels=[
            *_cache_panels(),
            *_stream_panels(),
            *_engine_panels(),
            row("Resets"),
            _resets_table(),
        ],
    )
