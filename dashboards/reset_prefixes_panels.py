"""Reset explorer: the reset's prefix groups and when each was back, from `reset_prefix_groups`
(what storage/reset_prefixes.py computed, stored as each recovery offset is reached)."""

from __future__ import annotations

from kvscope.dashboards.model import Json, row, sql, table
from kvscope.storage.reset_prefix_types import STATUS_COLORS

GROUPS_SQL = """
SELECT g.position + 1 AS "group", g.medium AS tier, g.kv_group AS "kv group", g.root,
       g.blocks, g.tokens, g.shared_blocks AS "shared blocks", g.back_at_s AS "back at (s)",
       g.status, g.first_tokens AS "first tokens"
FROM reset_prefix_groups g
WHERE g.reset_id = $reset
ORDER BY g.position
"""
BY_STATUS_SQL = """
SELECT g.status, count(*) AS groups, sum(g.blocks) AS blocks, sum(g.tokens) AS tokens,
       sum(g.tokens)::float / NULLIF(sum(sum(g.tokens)) OVER (), 0) AS "share of tokens"
FROM reset_prefix_groups g
WHERE g.reset_id = $reset
GROUP BY g.status
ORDER BY min(g.back_at_s) NULLS LAST, g.status
"""


def _status_colors() -> Json:
    return {
        "matcher": {"id": "byName", "options": "status"},
        "properties": [
            {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            {
                "id": "mappings",
                "value": [
                    {
                        "type": "value",
                        "options": {
                            s: {"color": c, "index": i}
                            for i, (s, c) in enumerate(STATUS_COLORS.items())
                        },
                    }
                ],
            },
        ],
    }


def prefix_panels() -> list[Json]:
    return [
        row("What came back, prefix by prefix"),
        table(
            "Prefixes back, by status",
            [sql(BY_STATUS_SQL)],
            description="The groups of the pre-reset cache (a root block and every block "
            "under it) by when 90 % of their blocks were hittable again, as of the last "
            "recovery offset reached (not back: not yet, while it is followed).",
            w=8,
            overrides=[_status_colors()],
        ),
        table(
            "Prefix groups before the reset",
            [sql(GROUPS_SQL)],
            description="Largest first; `back at` is the first recovery offset at which the "
            "group was back (empty: not back); `first tokens`, the root's first token ids "
            "(as text in kvscope's API, page and report when given --tokenizer).",
            w=16,
            overrides=[_status_colors()],
        ),
    ]
