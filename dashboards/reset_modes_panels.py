"""Reset explorer: the reset modes side by side on the reset's replica, as SQL over the stored
rows (resets and the requests they followed, reset_prefix_groups, engine_samples, refused
reset_requests), by storage/mode_compare.py's rules: one row per mode, medians over the mode's
resets that cleared (Python's median and PostgreSQL's percentile_cont(0.5) agree), a clear's
preemptions the counter's rise across it summed over engines (unknown if any engine lacks a
scrape on either side), the share of its prefix groups back by +10 s."""

from __future__ import annotations

from kvscope.dashboards.common import linked_request
from kvscope.dashboards.model import Json, row, sql, table
from kvscope.storage.mode_compare import BACK_BY_S, MODE_ORDER

_ORDER = ", ".join(f"'{m}'" for m in MODE_ORDER)
_SAMPLE = """
    SELECT x.preemptions AS p FROM engine_samples x
    WHERE x.replica = '$reset_replica' AND x.engine = e.engine AND x.preemptions IS NOT NULL
"""
MODES_SQL = f"""
WITH clears AS (
  SELECT r.id, r.ts, r.t50_s, r.t90_s, COALESCE(r.mode, q.mode) AS mode
  FROM resets r JOIN streams s ON s.id = r.stream_id{linked_request()}
  WHERE s.replica = '$reset_replica'
), engines AS (
  SELECT DISTINCT engine FROM engine_samples WHERE replica = '$reset_replica'
), preempted AS (
  SELECT c.id,
         CASE WHEN count(b.p) = count(*) AND count(a.p) = count(*) THEN sum(a.p - b.p) END AS n
  FROM clears c CROSS JOIN engines e
  LEFT JOIN LATERAL ({_SAMPLE} AND x.ts <= c.ts ORDER BY x.ts DESC LIMIT 1) b ON true
  LEFT JOIN LATERAL ({_SAMPLE} AND x.ts > c.ts ORDER BY x.ts LIMIT 1) a ON true
  GROUP BY c.id
), back AS (
  SELECT g.reset_id, avg(CASE WHEN g.back_at_s <= {BACK_BY_S} THEN 1.0 ELSE 0.0 END) AS share
  FROM reset_prefix_groups g JOIN clears c ON c.id = g.reset_id
  GROUP BY g.reset_id
), made AS (
  SELECT c.mode, count(*) AS n,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY c.t50_s) AS t50,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY c.t90_s) AS t90,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY p.n) AS preempted,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY b.share) AS back
  FROM clears c LEFT JOIN preempted p ON p.id = c.id LEFT JOIN back b ON b.reset_id = c.id
  WHERE c.mode IS NOT NULL
  GROUP BY c.mode
), refused AS (
  SELECT mode, count(*) AS n FROM reset_requests
  WHERE replica = '$reset_replica' AND outcome <> 'success'
  GROUP BY mode
)
SELECT COALESCE(m.mode, f.mode) AS mode,
       COALESCE(m.n, 0) + COALESCE(f.n, 0) AS resets, COALESCE(f.n, 0) AS refused,
       m.preempted, m.t50 AS "t50 (s)", m.t90 AS "t90 (s)", m.back AS "back at +10 s"
FROM made m FULL JOIN refused f ON f.mode = m.mode
ORDER BY COALESCE(array_position(ARRAY[{_ORDER}], COALESCE(m.mode, f.mode)), 99),
         COALESCE(m.mode, f.mode)
"""


def modes_panels() -> list[Json]:
    return [
        row("The modes side by side on $reset_replica"),
        table(
            "Reset modes side by side",
            [sql(MODES_SQL)],
            description="Every reset of the replica by mode, under the same load: how many were "
            "refused (vLLM refuses a default reset while requests run), and medians over those "
            "that cleared of the requests preempted, the seconds to 50 % / 90 % of the blocks, "
            "and the share of prefix groups back by +10 s. The study's result at a glance.",
            w=24,
        ),
    ]
