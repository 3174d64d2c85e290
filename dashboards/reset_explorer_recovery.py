"""Reset explorer, the recovery rows: one reset's recovery against seconds since it, and several
resets overlaid (PostgreSQL)."""

from __future__ import annotations

from kvscope.dashboards.common import (
    AROUND_AFTER_S,
    AROUND_BEFORE_S,
    explorer_url,
    linked_request,
)
from kvscope.dashboards.model import (
    Json,
    override,
    row,
    sql,
    table,
    trend,
)

WINDOW_S = 300
"""How far after each reset the recovery curves go (the last recovery offset kvscope keeps)."""
UNTIL = f"floor(COALESCE(r.recovery_until_ts, r.ts + {WINDOW_S + 1}))"
"""The end of a reset's curves: where its recovery stopped being followed (its window's end, or
the next reset of the stream), or the window's end while it is still followed."""


def recovery_panels() -> list[Json]:
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


def overlay_panels() -> list[Json]:
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
