"""Reset explorer, the rows about the reset itself: its facts and its map before vs after,
per tier (PostgreSQL)."""

from __future__ import annotations

from kvscope.dashboards.common import (
    linked_request,
)
from kvscope.dashboards.model import (
    Json,
    override,
    row,
    sql,
    stat,
    table,
)


def the_reset_panels() -> list[Json]:
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


def before_after_panels() -> list[Json]:
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
