"""The three reset modes side by side: one comparison the API, the report and the tests share.

Of one replica (one load: a recording or a lab run) in [from_ts, to_ts], every reset request
through kvscope and every stored clear, each as a `ResetFigures`:

- `refused`: the request's outcome was not success (vLLM refuses a `default` reset while
  requests run); such a request made no clear, so its other figures are None.
- `preempted`: the rise of vLLM's preemptions counter from the last scrape at or before the
  clear's `ts` to the first one after it, summed over engines; None (unknown, never 0) when
  either scrape is missing.
- `tokens_recomputed`: tokens of the pre-reset blocks cached again at the last recovery offset
  reached, from the event stream (storage/reset_prefixes.py's groups: blocks_back x block
  size, summed over groups). They were in the cache before the clear, so the engine computed
  them twice.
- `t50_s` / `t90_s`: as stored with the reset (the map back to 50 / 90 % of its blocks).
- `share_back_10s`: of the pre-reset prefix groups, the share back by +10 s
  (reset_prefixes' rule: 90 % of a group's blocks hittable again); None without groups.
- `orphans`: the orphans the reset left (a keep-running reset's).
- hit rate and TTFT p50 from the scrape, over `SCRAPE_WINDOW_S` before and after the clear.

`ModeFigures` holds each figure's median over the mode's resets (None where none has it) and
the share refused. Scrape and engine times are compared on the engine's clock (`ts`); a refused
request's `ts` is its `requested_at` (collector clock) moved onto the engine's clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from sqlalchemy import Connection, Row, select

from kvscope.storage import batch_log, schema
from kvscope.storage.reset_links import (
    LINK_WINDOW_S,
    linked_mode,
    linked_request,
    load_requests,
    resets_query,
)
from kvscope.storage.reset_prefix_types import tokens_recomputed
from kvscope.storage.reset_prefixes import reset_prefixes
from kvscope.storage.scrape import window_figures

MODE_ORDER = ("default", "preempt", "keep")
SCRAPE_WINDOW_S = 30.0
BACK_BY_S = 10.0


# The API serves these records as they are (pydantic reads a dataclass, and with this config a
# field's docstring becomes its description in the OpenAPI docs): no schema copies their fields.
_DOCUMENTED: Final = {"use_attribute_docstrings": True}


@dataclass(frozen=True, slots=True)
class RowsAfter:
    """Where one run of a store begins: the reset and reset request rows it wrote have ids
    above these (a store reused across runs whose engine clocks may overlap)."""

    reset_id: int
    request_id: int


@dataclass(frozen=True, slots=True)
class ResetFigures:
    """One reset request or clear of the comparison."""

    __pydantic_config__: ClassVar[dict[str, bool]] = _DOCUMENTED

    mode: str | None
    request_id: int | None
    reset_id: int | None
    """None: the request made no clear (refused)."""
    ts: float
    outcome: str | None
    refused: bool
    preempted: float | None
    """vLLM's preemptions delta; None: not scraped."""
    tokens_recomputed: int | None
    """Tokens of pre-reset blocks cached again at the last offset reached."""
    t50_s: float | None
    t90_s: float | None
    share_back_10s: float | None
    orphans: int | None
    hit_rate_before: float | None
    hit_rate_after: float | None
    ttft_p50_before: float | None
    ttft_p50_after: float | None


MEDIAN_FIELDS = (
    "preempted",
    "tokens_recomputed",
    "t50_s",
    "t90_s",
    "share_back_10s",
    "orphans",
    "hit_rate_before",
    "hit_rate_after",
    "ttft_p50_before",
    "ttft_p50_after",
)


@dataclass(frozen=True, slots=True)
class ModeFigures:
    """One mode's resets: how many, how many refused, and the medians of their figures."""

    __pydantic_config__: ClassVar[dict[str, bool]] = _DOCUMENTED

    mode: str
    resets: int
    refused: int
    medians: dict[str, float | None]
    """Over the mode's resets that cleared."""


@dataclass(frozen=True, slots=True)
class ModeComparison:
    """GET /resets/compare's answer: a replica's resets, and the medians per mode."""

    __pydantic_config__: ClassVar[dict[str, bool]] = _DOCUMENTED

    replica: str
    from_ts: float | None
    to_ts: float | None
    resets: tuple[ResetFigures, ...]
    modes: tuple[ModeFigures, ...]


def _preempted(conn: Connection, replica: str, ts: float) -> float | None:
    t = schema.engine_samples
    rows = conn.execute(
        select(t.c.engine, t.c.ts, t.c.preemptions).where(t.c.replica == replica)
    ).all()
    engines = {r.engine for r in rows}
    if not engines:
        return None
    total = 0.0
    for engine in engines:
        mine = [r for r in rows if r.engine == engine and r.preemptions is not None]
        before = max((r for r in mine if r.ts <= ts), key=lambda r: r.ts, default=None)
        after = min((r for r in mine if r.ts > ts), key=lambda r: r.ts, default=None)
        if before is None or after is None:
            return None
        total += after.preemptions - before.preemptions
    return total


def _of_reset(conn: Connection, reset: Row[Any], mode: str | None, request: Any) -> ResetFigures:
    prefixes = reset_prefixes(conn, int(reset.id))
    groups = prefixes.groups
    recomputed = tokens_recomputed(groups)
    back = [g for g in groups if g.back_at_s is not None and g.back_at_s <= BACK_BY_S]
    before = window_figures(conn, reset.replica, reset.ts - SCRAPE_WINDOW_S, reset.ts)
    after = window_figures(conn, reset.replica, reset.ts, reset.ts + SCRAPE_WINDOW_S)
    return ResetFigures(
        mode=mode,
        request_id=None if request is None else int(request.id),
        reset_id=int(reset.id),
        ts=float(reset.ts),
        outcome=None if request is None else str(request.outcome),
        refused=False,
        preempted=_preempted(conn, reset.replica, reset.ts),
        tokens_recomputed=int(recomputed),
        t50_s=reset.t50_s,
        t90_s=reset.t90_s,
        share_back_10s=len(back) / len(groups) if groups else None,
        orphans=len(prefixes.orphans),
        hit_rate_before=None if before is None else before.hit_rate,
        hit_rate_after=None if after is None else after.hit_rate,
        ttft_p50_before=None if before is None else before.ttft_p50,
        ttft_p50_after=None if after is None else after.ttft_p50,
    )


def _of_refused(request: Row[Any], ts: float) -> ResetFigures:
    unknown = dict.fromkeys(MEDIAN_FIELDS)
    return ResetFigures(
        mode=str(request.mode),
        request_id=int(request.id),
        reset_id=None,
        ts=ts,
        outcome=str(request.outcome),
        refused=True,
        **unknown,
    )


def _median(values: Sequence[float | int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def _by_mode(figures: Sequence[ResetFigures]) -> tuple[ModeFigures, ...]:
    modes = sorted(
        {f.mode for f in figures if f.mode is not None},
        key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER), m),
    )
    out = []
    for mode in modes:
        mine = [f for f in figures if f.mode == mode]
        made = [f for f in mine if not f.refused]
        medians = {name: _median([getattr(f, name) for f in made]) for name in MEDIAN_FIELDS}
        out.append(ModeFigures(mode, len(mine), sum(f.refused for f in mine), medians))
    return tuple(out)


def compare_modes(
    conn: Connection,
    replica: str,
    from_ts: float | None = None,
    to_ts: float | None = None,
    window: float = LINK_WINDOW_S,
    after: RowsAfter | None = None,
) -> ModeComparison:
    """The comparison of `replica`'s resets (clears by engine `ts`, requests that made none by
    `requested_at` shifted onto the engine's clock, batch_log.engine_time) in [from_ts, to_ts],
    on the engine's clock; either bound may be open. With `after`, only that run's rows."""

    def inside(ts: float) -> bool:
        return (from_ts is None or ts >= from_ts) and (to_ts is None or ts <= to_ts)

    requests = load_requests(conn, replica)
    resets_of = resets_query().where(schema.streams.c.replica == replica)
    if after is not None:
        requests = {
            name: [q for q in qs if q.id > after.request_id] for name, qs in requests.items()
        }
        resets_of = resets_of.where(schema.resets.c.id > after.reset_id)
    resets = conn.execute(resets_of).all()
    figures: list[ResetFigures] = []
    for reset in resets:
        if not inside(reset.ts):
            continue
        request = linked_request(reset, requests, window)
        figures.append(_of_reset(conn, reset, linked_mode(reset.mode, request), request))
    sid = conn.execute(
        select(schema.streams.c.id)
        .where(schema.streams.c.replica == replica)
        .order_by(schema.streams.c.rank)
    ).first()
    for request in requests.get(replica, ()):
        if request.outcome == "success":
            continue
        # Requested on the collector's clock; compared with clears on the engine's.
        at = None if sid is None else batch_log.engine_time(conn, sid.id, request.requested_at)
        ts = float(request.requested_at if at is None else at)
        if inside(ts):
            figures.append(_of_refused(request, ts))
    figures.sort(key=lambda f: f.ts)
    return ModeComparison(replica, from_ts, to_ts, tuple(figures), _by_mode(figures))
