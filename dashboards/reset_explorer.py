"""Reset explorer: one reset's before and after, its recovery, the engine around it, and several
resets overlaid against seconds since each. The rows are built in reset_explorer_reset.py,
reset_explorer_recovery.py, reset_prefixes_panels.py, reset_modes_panels.py and
reset_explorer_engine.py."""

from __future__ import annotations

from kvscope.dashboards.common import (
    AROUND_AFTER_S,
    AROUND_BEFORE_S,
    RESET_EXPLORER_UID,
    explorer_url,
    linked_request,
    postgres_variable,
    prometheus_variable,
    requests_annotation,
    resets_annotation,
)
from kvscope.dashboards.model import (
    POSTGRES,
    Json,
    dashboard,
    link,
    query_variable,
)
from kvscope.dashboards.reset_explorer_engine import engine_panels
from kvscope.dashboards.reset_explorer_recovery import overlay_panels, recovery_panels
from kvscope.dashboards.reset_explorer_reset import before_after_panels, the_reset_panels
from kvscope.dashboards.reset_modes_panels import modes_panels
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
            *the_reset_panels(),
            *before_after_panels(),
            *recovery_panels(),
            *prefix_panels(),
            *modes_panels(),
            *overlay_panels(),
            *engine_panels(),
        ],
        time_from="now-6h",
        refresh="",
    )
