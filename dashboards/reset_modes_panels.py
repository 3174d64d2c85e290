"""Reset explorer: the reset modes side by side on the reset's replica, as SQL over the stored
rows (resets and the requests they followed, reset_prefix_groups, engine_samples, refused
reset_requests), by storage/mode_compare.py's rules: one row per mode, medians over the mode's
resets that cleared (Python's median and PostgreSQL's percentile_cont(0.5) agree), a clear's
preemptions the counter's rise across it summed over engines (unknown if any engine lacks a
scrape on either side), the share of its prefix groups back by +10 s, its tokens recomputed and
orphans left (stored with its groups), and vLLM's hit rate and TTFT p50 around it."""

from __future__ import annotations

from kvscope.dashboards.common import linked_request
from kvscope.dashboards.model import Json, row, sql, table
from kvscope.storage.mode_compare import BACK_BY_S, MODE_ORDER, SCRAPE_WINDOW_S

_ORDER = ", ".join(f"'{m}'" for m in MODE_ORDER)
_SAMPLE = """
    SELECT x.preemptions AS p FROM engine_samples x
    WHERE x.replica = '$reset_replica' AND x.engine = e.engine AND x.preemptions IS NOT NULL
"""


def _float8(blob: str, at: str) -> str:
    """The big-endian IEEE float64 at byte `at` (1-based) of `blob`, in SQL: PostgreSQL reads
    no msgpack, and storage/scrape.py writes each float of `ttft_buckets` as one (0xcb + 8
    bytes). Exact: the mantissa and the powers of two are exact in float8."""
    bits = f"('x' || encode(substring({blob} FROM {at} FOR 8), 'hex'))::bit(64)::bigint"
    exp, mant = f"(({bits} >> 52) & 2047)", f"({bits} & 4503599627370495)"
    return (
        f"(CASE WHEN {exp} = 2047 THEN 'Infinity'::float8"
        f" WHEN {exp} = 0 THEN {mant}::float8 * power(2::float8, -1074)"
        f" ELSE (1 + {mant}::float8 * power(2::float8, -52)) * power(2::float8, {exp} - 1023)"
        f" END * CASE WHEN {bits} < 0 THEN -1 ELSE 1 END)"
    )


# storage/scrape.py's window_figures per clear, SCRAPE_WINDOW_S before and after it: the deltas
# of consecutive scrapes of an engine inside the window (a pair where a counter went down, a
# restart, left out), summed over engines; the hit rate hits / queries, the TTFT p50 PromQL's
# histogram_quantile over the summed bucket deltas (pairs whose bucket bounds differ left out).
_WINDOWS = f"""
samples AS (
  SELECT c.id, w.side, x.engine, x.ts,
         x.prefix_cache_queries AS q, x.prefix_cache_hits AS h, x.preemptions AS p,
         x.ttft_count AS tc, x.ttft_buckets AS b
  FROM clears c CROSS JOIN (VALUES ('before'), ('after')) w(side)
  JOIN engine_samples x ON x.replica = '$reset_replica'
   AND x.ts >= c.ts - CASE WHEN w.side = 'before' THEN {SCRAPE_WINDOW_S} ELSE 0 END
   AND x.ts <= c.ts + CASE WHEN w.side = 'after' THEN {SCRAPE_WINDOW_S} ELSE 0 END
), paired AS (
  SELECT s.*, lag(s.ts) OVER w AS ts0, lag(s.q) OVER w AS q0, lag(s.h) OVER w AS h0,
         lag(s.p) OVER w AS p0, lag(s.tc) OVER w AS tc0, lag(s.b) OVER w AS b0
  FROM samples s WINDOW w AS (PARTITION BY s.id, s.side, s.engine ORDER BY s.ts)
), pairs AS (
  SELECT row_number() OVER () AS pair, * FROM paired
  WHERE ts0 IS NOT NULL AND NOT COALESCE(q < q0, false) AND NOT COALESCE(h < h0, false)
    AND NOT COALESCE(p < p0, false) AND NOT COALESCE(tc < tc0, false)
), rates AS (
  SELECT id, side, sum(CASE WHEN q0 IS NOT NULL AND h0 IS NOT NULL THEN h - h0 END)
         / NULLIF(sum(CASE WHEN q0 IS NOT NULL AND h0 IS NOT NULL THEN q - q0 END), 0) AS rate
  FROM pairs WHERE q IS NOT NULL AND h IS NOT NULL
  GROUP BY id, side
), headed AS (
  SELECT pair, id, side, b, b0, CASE WHEN get_byte(b, 0) = 220 THEN 3 ELSE 1 END AS hb,
         CASE WHEN get_byte(b, 0) = 220 THEN get_byte(b, 1) * 256 + get_byte(b, 2)
              ELSE get_byte(b, 0) - 144 END AS n
  FROM pairs WHERE b IS NOT NULL AND b0 IS NOT NULL AND length(b) = length(b0)
    AND (get_byte(b, 0) BETWEEN 144 AND 159 OR get_byte(b, 0) = 220)
), cells AS (
  SELECT pair, id, side, n,
         {_float8("b", "hb + 19 * i + 3")} AS le, {_float8("b0", "hb + 19 * i + 3")} AS le0,
         {_float8("b", "hb + 19 * i + 12")} - {_float8("b0", "hb + 19 * i + 12")} AS d
  FROM headed CROSS JOIN LATERAL generate_series(0, n - 1) AS i
  WHERE length(b) = hb + 19 * n
), summed AS (
  SELECT c.id, c.side, c.le, sum(c.d) AS n FROM cells c
  WHERE c.pair NOT IN (SELECT pair FROM cells WHERE le IS DISTINCT FROM le0)
  GROUP BY c.id, c.side, c.le
), ranked AS (
  SELECT id, side, le, n, lag(le) OVER w AS le0, lag(n) OVER w AS n0,
         row_number() OVER w AS k, count(*) OVER x AS m,
         last_value(le) OVER x AS top, last_value(n) OVER x AS total
  FROM summed
  WINDOW w AS (PARTITION BY id, side ORDER BY le),
         x AS (PARTITION BY id, side ORDER BY le ROWS BETWEEN UNBOUNDED PRECEDING
               AND UNBOUNDED FOLLOWING)
), p50 AS (
  -- Every row is computed (NULLIF: a bucket no rank falls in may have no count of its own);
  -- DISTINCT ON keeps the one the rank falls in.
  SELECT DISTINCT ON (id, side) id, side,
         CASE WHEN m < 2 OR top <> 'Infinity' OR total <= 0 THEN NULL
              WHEN k = m THEN le0
              WHEN k = 1 AND le <= 0 THEN le
              WHEN k = 1 THEN le * (0.5 * total / NULLIF(n, 0))
              ELSE le0 + (le - le0) * ((0.5 * total - n0) / NULLIF(n - n0, 0)) END AS ttft
  FROM ranked
  ORDER BY id, side, CASE WHEN k < m AND n >= 0.5 * total THEN k ELSE m END, k DESC
), engine_figures AS (
  -- Each figure from its own rows (rates and p50 have one per reset and side): an engine
  -- that exposes TTFT but no prefix-cache counters still has its TTFT.
  SELECT c.id,
         (SELECT r.rate FROM rates r WHERE r.id = c.id AND r.side = 'before') AS hit_before,
         (SELECT r.rate FROM rates r WHERE r.id = c.id AND r.side = 'after') AS hit_after,
         (SELECT t.ttft FROM p50 t WHERE t.id = c.id AND t.side = 'before') AS ttft_before,
         (SELECT t.ttft FROM p50 t WHERE t.id = c.id AND t.side = 'after') AS ttft_after
  FROM clears c
)"""
MODES_SQL = f"""
WITH clears AS (
  SELECT r.id, r.ts, r.t50_s, r.t90_s, r.tokens_recomputed, r.orphans_left,
         COALESCE(r.mode, q.mode) AS mode
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
),{_WINDOWS}, made AS (
  SELECT c.mode, count(*) AS n,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY p.n) AS preempted,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY c.tokens_recomputed) AS recomputed,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY c.t50_s) AS t50,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY c.t90_s) AS t90,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY b.share) AS back,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY c.orphans_left) AS orphans,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY f.hit_before) AS hit_before,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY f.hit_after) AS hit_after,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY f.ttft_before) AS ttft_before,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY f.ttft_after) AS ttft_after
  FROM clears c LEFT JOIN preempted p ON p.id = c.id LEFT JOIN back b ON b.reset_id = c.id
  LEFT JOIN engine_figures f ON f.id = c.id
  WHERE c.mode IS NOT NULL
  GROUP BY c.mode
), refused AS (
  SELECT mode, count(*) AS n FROM reset_requests
  WHERE replica = '$reset_replica' AND outcome <> 'success'
  GROUP BY mode
)
SELECT COALESCE(m.mode, f.mode) AS mode,
       COALESCE(m.n, 0) + COALESCE(f.n, 0) AS resets, COALESCE(f.n, 0) AS refused,
       m.preempted, m.recomputed AS "tokens recomputed", m.t50 AS "t50 (s)",
       m.t90 AS "t90 (s)", m.back AS "back at +10 s", m.orphans,
       m.hit_before AS "hit rate before", m.hit_after AS "hit rate after",
       m.ttft_before AS "TTFT p50 before", m.ttft_after AS "TTFT p50 after"
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
            "that cleared of the requests preempted, the tokens of pre-reset blocks computed "
            "again, the seconds to 50 % / 90 % of the blocks, the share of prefix groups back "
            "by +10 s, the orphans left, and vLLM's own prefix-cache hit rate and TTFT p50 over "
            "the 30 s before and after. The study's result at a glance.",
            w=24,
        ),
    ]
