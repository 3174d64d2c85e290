"""Reset explorer: one reset's before and after, its recovery, the engine around it, and several
resets overlaid against seconds since each."""

from __future__ import annotations

from kvscope.dashboards.common import (
    AROUND_AFTER_S,
    AROUND_BEFORE_S,
    RATE,
    RESET_EXPLORER_UID,
    explorer_url,
    kv,
    linked_request,
    postgres_variable,
    prometheus_variable,
    requests_annotation,
    resets_annotation,
    vllm,
)
from kvscope.dashboards.model import (
    POSTGRES,
    Json,
    dashboard,
    link,
    override,
    prom,
    query_variable,
    row,
    sql,
    stat,
    table,
    timeseries,
    trend,
)
from kvscope.dashboards.reset_prefixes_panels import prefix_panels

RESET_CHOICES = f"""
    SELECT r.id AS __value,
           format('#%s %s/%s %s UTC, %s%s', r.id, s.replica, s.rank,
                  to_char(to_timestamp(r.ts) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                  r.reason, COALESCE(', ' || COALESCE(r.mode, q.mode), '')) AS __text
    FROM resets r
    JOIN streams s ON s.id = r.stream_id{linked_request()}
    ORDER BY r.ts DESC
    LIMIT 1000
"""
WINDOW_S = 300
"""How far after each reset the recovery curves go (the last recovery offset kvscope keeps)."""
UNTIL = f"floor(COALESCE(r.recovery_until_ts, r.ts + {WINDOW_S + 1}))"
"""The end of a reset's curves: where its recovery stopped being followed (its window's end, or
the next reset of the stream), or the window's end while it is still followed."""
REPLICA = 'replica="$reset_replica"'


def variables() -> list[Json]:
    return [
        prometheus_variable(),
        postgres_variable(),
        query_variable(
            "reset",
            "Reset",
            POSTGRES,
            RESET_CHOICES,
            sort=0,
            description="The reset to explore (newest first).",
        ),
        query_variable(
            "compare",
            "Overlay",
            POSTGRES,
            RESET_CHOICES,
            sort=0,
            multi=True,
            include_all=True,
            description="Resets to overlay in the comparison row.",
        ),
        query_variable(
            "reset_replica",
            "Replica of the reset",
            POSTGRES,
            """
            SELECT s.replica FROM resets r JOIN streams s ON s.id = r.stream_id
            WHERE r.id = $reset
            """,
            hide=2,
        ),
        query_variable(
            "reset_from",
            "From (ms)",
            POSTGRES,
            f"SELECT ((ts - {AROUND_BEFORE_S}) * 1000)::bigint FROM resets WHERE id = $reset",
            hide=2,
        ),
        query_variable(
            "reset_to",
            "To (ms)",
            POSTGRES,
            f"SELECT ((ts + {AROUND_AFTER_S}) * 1000)::bigint FROM resets WHERE id = $reset",
            hide=2,
        ),
    ]


def _the_reset() -> list[Json]:
    return [
        row("The reset"),
        stat(
            "Before the reset",
            [
                sql("""
                SELECT before_blocks AS "blocks", before_hittable AS "hittable",
                       before_orphans AS "orphans", before_tokens AS "tokens"
                FROM resets WHERE id = $reset
                """)
            ],
            description="The map just before it was emptied: distinct blocks, blocks a prefix "
            "lookup could reach, orphans, and the prompt tokens those hittable blocks held.",
            unit="short",
            w=8,
        ),
        stat(
            "Recovery",
            [
                sql("""
                SELECT t50_s AS "50 % back", t90_s AS "90 % back", peak_orphans AS "peak orphans"
                FROM resets WHERE id = $reset
                """)
            ],
            description="Seconds until the map held 50 % and 90 % of its pre-reset block count "
            "again (empty: not reached before the next reset or the end of the stream).",
            unit="s",
            w=8,
            overrides=[override("peak orphans", unit="short")],
        ),
        table(
            "What it was",
            [
                sql(f"""
                SELECT to_timestamp(r.ts) AS "time", s.replica, s.rank, r.epoch, r.seq, r.reason,
                       COALESCE(r.mode, q.mode) AS mode, q.outcome AS request,
                       q.requested_by, r.degraded AS "map was degraded",
                       to_timestamp(r.recovery_until_ts) AS "followed until"
                FROM resets r
                JOIN streams s ON s.id = r.stream_id{linked_request()}
                WHERE r.id = $reset
                """)
            ],
            description="Why the cache was emptied (all_blocks_cleared or a restart) and, when "
            "it was asked for through kvscope, the request's mode and vLLM's answer.",
            w=8,
            h=4,
        ),
    ]


def _before_after() -> list[Json]:
    return [
        row("Before vs after"),
        table(
            "Blocks per tier: before vs 60 s after",
            [
                sql("""
                WITH r AS (SELECT stream_id, ts FROM resets WHERE id = $reset),
                before AS (
                  SELECT DISTINCT ON (x.medium, x.grp) x.medium, x.grp, x.stored, x.hittable
                  FROM rollups x JOIN r ON x.stream_id = r.stream_id
                  WHERE x.second < floor(r.ts)
                  ORDER BY x.medium, x.grp, x.second DESC
                ),
                after AS (
                  SELECT DISTINCT ON (x.medium, x.grp) x.medium, x.grp, x.stored, x.hittable,
                         x.orphans
                  FROM rollups x JOIN r ON x.stream_id = r.stream_id
                  WHERE x.second BETWEEN floor(r.ts) AND floor(r.ts) + 60
                  ORDER BY x.medium, x.grp, x.second DESC
                )
                SELECT COALESCE(b.medium, a.medium) || ' group ' || COALESCE(b.grp, a.grp)
                         AS tier,
                       b.stored AS "stored before", b.hittable AS "hittable before",
                       a.stored AS "stored after 60 s", a.hittable AS "hittable after 60 s",
                       a.orphans AS "orphans after 60 s"
                FROM before b FULL JOIN after a ON a.medium = b.medium AND a.grp = b.grp
                ORDER BY 1
                """)
            ],
            description="From the per-second rollups (kept 30 days): the last second before "
            "the reset and the last second within 60 s after it, per tier and KV-cache group.",
            w=12,
        ),
        table(
            "Before and at each recovery offset",
            [
                sql("""
                SELECT 'before' AS "when", NULL::double precision AS offset_s,
                       before_blocks AS blocks, before_hittable AS hittable,
                       before_orphans AS orphans, 1.0 AS "blocks back", 1.0 AS "tokens back"
                FROM resets WHERE id = $reset
                UNION ALL
                SELECT '+' || offset_s || ' s', offset_s, blocks, hittable, orphans,
                       share_blocks_back, share_tokens_back
                FROM reset_recovery WHERE reset_id = $reset
                ORDER BY offset_s NULLS FIRST
                """)
            ],
            description="The whole map before, then at 1 to 300 s after: blocks, hittable, "
            "orphans, and the share of the pre-reset blocks (and of the prompt tokens in its "
            "hittable blocks) cached again.",
            w=12,
            overrides=[
                override("blocks back", unit="percentunit"),
                override("tokens back", unit="percentunit"),
            ],
            transformations=[{"id": "organize", "options": {"excludeByName": {"offset_s": True}}}],
        ),
    ]


def _recovery() -> list[Json]:
    return [
        row("Recovery against seconds since the reset"),
        trend(
            "Blocks around the reset, per second",
            "seconds since reset",
            [
                sql(f"""
                SELECT x.second - floor(r.ts) AS "seconds since reset",
                       sum(x.stored) AS stored, sum(x.hittable) AS hittable,
                       sum(x.orphans) AS orphans, max(r.before_blocks) AS "stored before"
                FROM resets r JOIN rollups x ON x.stream_id = r.stream_id
                WHERE r.id = $reset
                  AND x.second >= floor(r.ts) - 60 AND x.second < {UNTIL}
                GROUP BY x.second, r.ts
                ORDER BY 1
                """)
            ],
            description="Every tier summed, a point per second with batches (rollups), from a "
            "minute before to five minutes after (or the next reset); the flat line is the size "
            "just before the reset.",
            unit="short",
            min_value=0,
        ),
        trend(
            "Share of the pre-reset cache back",
            "seconds since reset",
            [
                sql("""
                SELECT offset_s AS "seconds since reset", share_blocks_back AS "blocks back",
                       share_tokens_back AS "prompt tokens back"
                FROM reset_recovery WHERE reset_id = $reset
                ORDER BY offset_s
                """)
            ],
            description="Of the blocks cached just before the reset, the share cached again; "
            "and of the prompt tokens in its hittable blocks, the share hittable again. The "
            "store writes these when the 300 s window ends (or at the next reset).",
            unit="percentunit",
            min_value=0,
            max_value=1,
        ),
    ]


_PARTITION: Json = {
    "id": "partitionByValues",
    "options": {"fields": ["reset"], "keepFields": False, "naming": {"asLabels": False}},
}


def _overlay() -> list[Json]:
    return [
        row("Several resets overlaid ($compare)"),
        trend(
            "Blocks vs before, per second",
            "seconds since reset",
            [
                sql(f"""
                SELECT x.second - floor(r.ts) AS "seconds since reset", '#' || r.id AS reset,
                       sum(x.stored)::double precision / NULLIF(r.before_blocks, 0)
                         AS "blocks vs before"
                FROM resets r JOIN rollups x ON x.stream_id = r.stream_id
                WHERE r.id IN ($compare) AND x.second >= floor(r.ts) AND x.second < {UNTIL}
                GROUP BY r.id, r.ts, r.before_blocks, x.second
                ORDER BY r.id, 1
                """)
            ],
            description="Each reset's cache size (every tier) over its size before the reset, "
            "against seconds since that reset, up to five minutes or its stream's next reset.",
            unit="percentunit",
            min_value=0,
            transformations=[_PARTITION],
        ),
        trend(
            "Prompt tokens back",
            "seconds since reset",
            [
                sql("""
                SELECT p.offset_s AS "seconds since reset", '#' || p.reset_id AS reset,
                       p.share_tokens_back AS "prompt tokens back"
                FROM reset_recovery p
                WHERE p.reset_id IN ($compare)
                ORDER BY p.reset_id, p.offset_s
                """)
            ],
            description="Share of each reset's pre-reset hittable prompt tokens hittable again.",
            unit="percentunit",
            min_value=0,
            max_value=1,
            transformations=[_PARTITION],
        ),
        table(
            "Side by side",
            [
                sql(f"""
                SELECT r.id, to_timestamp(r.ts) AS "time", s.replica, s.rank, r.reason,
                       COALESCE(r.mode, q.mode) AS mode, q.outcome AS request, r.before_blocks,
                       r.before_hittable, r.t50_s, r.t90_s, r.peak_orphans,
                       ((r.ts - {AROUND_BEFORE_S}) * 1000)::bigint AS from_ms,
                       ((r.ts + {AROUND_AFTER_S}) * 1000)::bigint AS to_ms
                FROM resets r
                JOIN streams s ON s.id = r.stream_id{linked_request()}
                WHERE r.id IN ($compare)
                ORDER BY r.ts
                """)
            ],
            w=24,
            h=6,
            links=[
                {
                    "title": "Explore this reset",
                    "url": explorer_url(
                        "${__data.fields.id}", "${__data.fields.from_ms}", "${__data.fields.to_ms}"
                    ),
                }
            ],
            overrides=[override("t50_s", unit="s"), override("t90_s", unit="s")],
            transformations=[
                {"id": "organize", "options": {"excludeByName": {"from_ms": True, "to_ms": True}}}
            ],
        ),
    ]


def _engine() -> list[Json]:
    bucket = vllm("vllm:time_to_first_token_seconds_bucket")
    ttft = f"sum by (le) (rate({bucket}{{{REPLICA}}}[{RATE}]))"
    return [
        row("The engine around it (Prometheus; use the link above for the reset's time range)"),
        timeseries(
            "Prefix-cache hit rate",
            [
                prom(
                    f"sum(rate({vllm('vllm:prefix_cache_hits_total')}{{{REPLICA}}}[{RATE}])) / "
                    f"sum(rate({vllm('vllm:prefix_cache_queries_total')}{{{REPLICA}}}[{RATE}]))",
                    "$reset_replica hit rate",
                )
            ],
            unit="percentunit",
            min_value=0,
            max_value=1,
            w=12,
        ),
        timeseries(
            "Time to first token",
            [
                prom(f"histogram_quantile(0.5, {ttft})", "p50"),
                prom(f"histogram_quantile(0.99, {ttft})", "p99", "B"),
            ],
            description="From vLLM's time_to_first_token_seconds histogram.",
            unit="s",
            min_value=0,
            w=12,
        ),
        timeseries(
            "Preemptions and waiting requests",
            [
                prom(
                    f"sum(increase({vllm('vllm:num_preemptions_total')}{{{REPLICA}}}[{RATE}]))",
                    "preemptions",
                ),
                prom(f"sum({vllm('vllm:num_requests_waiting')}{{{REPLICA}}})", "waiting", "B"),
                prom(f"sum({vllm('vllm:num_requests_running')}{{{REPLICA}}})", "running", "C"),
            ],
            description="A reset that preempts running requests shows up here first.",
            unit="short",
            min_value=0,
            w=12,
        ),
        timeseries(
            "Blocks (kvscope)",
            [
                prom(
                    f"sum by (medium) ({kv('kvscope_cache_blocks')}{{{REPLICA}}})",
                    "{{medium}} stored",
                ),
                prom(
                    f"sum by (medium) ({kv('kvscope_cache_hittable_blocks')}{{{REPLICA}}})",
                    "{{medium}} hittable",
                    "B",
                ),
            ],
            unit="short",
            min_value=0,
            w=12,
        ),
    ]


def build() -> Json:
    this = resets_annotation("r.id = $reset", "This reset")
    others = resets_annotation("s.replica = '$reset_replica' AND r.id <> $reset", "Other resets")
    others["iconColor"] = "blue"
    return dashboard(
        uid=RESET_EXPLORER_UID,
        title="kvscope / Reset explorer",
        description="One reset: the map before and after, per tier; how it recovered against "
        "seconds since the reset; vLLM's hit rate, TTFT and preemptions around it; and several "
        "resets overlaid.",
        variables=variables(),
        annotations=[this, others, requests_annotation("q.replica = '$reset_replica'")],
        links=[
            link(
                "Around the selected reset",
                explorer_url("${reset}", "${reset_from}", "${reset_to}"),
                "Sets the time range to 5 minutes before and 10 after the reset",
            )
        ],
        panels=[
            *_the_reset(),
            *_before_after(),
            *_recovery(),
            *prefix_panels(),
            *_overlay(),
            *_engine(),
        ],
        time_from="now-6h",
        refresh="",
    )
