"""The engine's own view: scrape each replica's vLLM /metrics into `engine_samples`.

A replica configured with its metrics URL is scraped every few seconds, with no Prometheus
server in between. Each scrape stores one row per vLLM engine (the `engine` label, a DP rank):
prefix-cache queries and hits, preemptions, running and waiting requests, KV usage and the
time-to-first-token histogram, all as exposed (counters stay cumulative). `hit_rate_series`
turns consecutive rows into hit rate and TTFT quantiles, so a reset's report can show both
recovering.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from http.client import HTTPException
from typing import Any, NamedTuple

import msgspec
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, Engine, Row, insert, select
from sqlalchemy.exc import SQLAlchemyError

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.storage import schema
from kvscope.storage.redact import redact

logger = logging.getLogger(__name__)

# Sample names as vLLM exposes them (counters carry `_total`) -> engine_samples columns.
# vLLM labels each with model_name and engine; values are summed over every label but engine.
_FIELDS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
}
_TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
_COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "preemptions", "ttft_count")
UNLABELLED_ENGINE = "0"
"""The engine of samples without an `engine` label (servers that run a single engine)."""
# The classic text format: what vLLM's /metrics answers unless asked for OpenMetrics.
_ACCEPT = "text/plain;version=0.0.4"
MAX_BODY_BYTES = 16 << 20


class ScrapeError(Exception):
    """A metrics URL did not answer with vLLM's Prometheus text."""


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One engine's figures at one scrape; a figure the server did not expose is None."""

    ts: float
    engine: str
    prefix_cache_queries: float | None = None
    """Tokens looked up in the prefix cache (counter)."""
    prefix_cache_hits: float | None = None
    """Of those, tokens found cached (counter)."""
    preemptions: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    """vLLM's kv_cache_usage_perc: a fraction (0..1) despite its name."""
    ttft_sum: float | None = None
    ttft_count: float | None = None
    ttft_buckets: dict[float, float] = field(default_factory=dict)
    """Upper bound `le` (ascending, +inf last) -> cumulative count; empty when not exposed."""


def parse_vllm_metrics(text: str, ts: float | None = None) -> list[EngineSample]:
    """The engines' samples in a /metrics body, one per `engine` label, sorted by engine."""
    figures: dict[str, dict[str, float]] = {}
    buckets: dict[str, dict[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith("vllm:"):
                    continue
                engine = sample.labels.get("engine", UNLABELLED_ENGINE)
                mine = figures.setdefault(engine, {})
                column = _FIELDS.get(sample.name)
                if column is not None:
                    mine[column] = mine.get(column, 0.0) + float(sample.value)
                elif sample.name == _TTFT_BUCKET:
                    le = float(sample.labels["le"])
                    counts = buckets.setdefault(engine, {})
                    counts[le] = counts.get(le, 0.0) + float(sample.value)
    except (ValueError, KeyError, IndexError) as exc:
        raise ScrapeError(f"not Prometheus text: {exc}") from exc
    if not figures:
        raise ScrapeError("no vllm: samples in the body (is this vLLM's /metrics?)")
    when = time.time() if ts is None else ts
    return [
        EngineSample(
            when,
            engine,
            **figures[engine],
            ttft_buckets=dict(sorted(buckets.get(engine, {}).items())),
        )
        for engine in sorted(figures)
    ]


def fetch_metrics(url: str, timeout_s: float) -> str:
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_BODY_BYTES + 1)
            charset = response.headers.get_content_charset() or "utf-8"
        if len(body) > MAX_BODY_BYTES:
            raise ScrapeError(f"GET {redact(url)}: body larger than {MAX_BODY_BYTES} bytes")
        return body.decode(charset)
    except (OSError, HTTPException, UnicodeDecodeError, LookupError) as exc:
        raise ScrapeError(redact(f"GET {url}: {exc}")) from exc


def sample_row(replica: str, sample: EngineSample) -> dict[str, Any]:
    row = {f.name: getattr(sample, f.name) for f in fields(sample)}
    row["replica"] = replica
    row["ttft_buckets"] = (
        msgspec.msgpack.encode(list(sample.ttft_buckets.items())) if sample.ttft_buckets else None
    )
    return row


class MetricsScraper:
    """Scrapes each replica's metrics URL every `interval_s` on one thread, into the store.

    A replica that fails (unreachable, not vLLM's metrics, the store down) is counted in
    `errors`, logged at most once per replica per 10 s, and tried again at the next tick: the
    thread never dies of it. Replicas are scraped one after another, so a hung one delays the
    others by at most `timeout_s`.
    """

    def __init__(
        self,
        engine: Engine,
        targets: Mapping[str, str],
        interval_s: float = 5.0,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.targets = dict(targets)
        """replica -> metrics URL (http://host:port/metrics)."""
        self.interval_s = interval_s
        self.timeout_s = min(interval_s, 5.0) if timeout_s is None else timeout_s
        self.errors: Counter[str] = Counter()
        self.scrapes: Counter[str] = Counter()
        self.last_error: dict[str, str] = {}
        self._engine = engine
        self._clock = clock
        self._log = RateLimitedLog(logger)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="kvscope-metrics-scraper", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("the metrics scraper did not stop within %.0f s", timeout)

    def scrape_once(self) -> int:
        """Scrape every target once; returns the rows stored."""
        return sum(self._scrape(replica, url) for replica, url in self.targets.items())

    def _scrape(self, replica: str, url: str) -> int:
        try:
            text = fetch_metrics(url, self.timeout_s)
            rows = [sample_row(replica, s) for s in parse_vllm_metrics(text, self._clock())]
            with self._engine.begin() as conn:
                conn.execute(insert(schema.engine_samples), rows)
        except (ScrapeError, SQLAlchemyError) as exc:
            self.errors[replica] += 1
            self.last_error[replica] = str(exc)
            self._log.warning(replica, "scraping %s failed: %s", replica, exc)
            return 0
        self.scrapes[replica] += 1
        return len(rows)

    def _run(self) -> None:
        due = time.monotonic()
        while True:
            try:
                self.scrape_once()
            except Exception:  # a bug must not end scraping for every replica
                logger.exception("metrics scrape failed")
            now = time.monotonic()
            due = max(due + self.interval_s, now)  # fell behind: skip ticks, never burst
            if self._stop.wait(due - now):
                return


# --- reading ---------------------------------------------------------------------------------
class HitRatePoint(NamedTuple):
    ts: float
    """The end of the interval (the later scrape)."""
    hit_rate: float | None
    """Prefix-cache hits / queries (tokens) in the interval; None without queries."""
    ttft_p50: float | None
    """TTFT quantiles (s) of the first tokens in the interval; None without any."""
    ttft_p99: float | None


@dataclass
class _Interval:
    queries: float = 0.0
    hits: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)

    def add(self, before: Row[Any], after: Row[Any]) -> None:
        if None not in (
            before.prefix_cache_queries,
            before.prefix_cache_hits,
            after.prefix_cache_queries,
            after.prefix_cache_hits,
        ):
            self.queries += after.prefix_cache_queries - before.prefix_cache_queries
            self.hits += after.prefix_cache_hits - before.prefix_cache_hits
        old, new = _buckets(before.ttft_buckets), _buckets(after.ttft_buckets)
        if new and new.keys() == old.keys():
            for le, count in new.items():
                self.buckets[le] = self.buckets.get(le, 0.0) + count - old[le]


def _buckets(blob: bytes | None) -> dict[float, float]:
    if blob is None:
        return {}
    return dict(msgspec.msgpack.decode(blob, type=list[tuple[float, float]]))


def _restarted(before: Row[Any], after: Row[Any]) -> bool:
    """A counter went down: the engine restarted within the interval."""
    for name in _COUNTERS:
        old, new = getattr(before, name), getattr(after, name)
        if old is not None and new is not None and new < old:
            return True
    return False


def hit_rate_series(
    conn: Connection, replica: str, from_ts: float, to_ts: float, engine: str | None = None
) -> list[HitRatePoint]:
    """Hit rate and TTFT p50 / p99 over each interval between consecutive scrapes of `replica`.

    Only samples taken in [from_ts, to_ts] count, and each engine's first one is its baseline:
    start a little before the instant of interest. A point sums the interval's deltas over the
    replica's engines (or only `engine`); an engine whose counters went down in the interval
    (it restarted) is left out of it, and an interval every engine restarted in has no point.
    """
    t = schema.engine_samples
    query = (
        select(t)
        .where(t.c.replica == replica, t.c.ts >= from_ts, t.c.ts <= to_ts)
        .order_by(t.c.engine, t.c.ts)
    )
    if engine is not None:
        query = query.where(t.c.engine == engine)
    intervals: dict[float, _Interval] = {}
    previous: dict[str, Row[Any]] = {}
    for row in conn.execute(query):
        before, previous[row.engine] = previous.get(row.engine), row
        if before is not None and not _restarted(before, row):
            intervals.setdefault(row.ts, _Interval()).add(before, row)
    return [
        HitRatePoint(
            ts,
            interval.hits / interval.queries if interval.queries > 0 else None,
            histogram_quantile(0.5, interval.buckets),
            histogram_quantile(0.99, interval.buckets),
        )
        for ts, interval in sorted(intervals.items())
    ]


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """PromQL's histogram_quantile over cumulative `buckets` (le -> count, +inf included):
    linear interpolation inside the bucket the rank falls in, the first bucket starting at 0,
    and the highest finite bound when the rank falls in +inf. None without observations."""
    bounds = sorted(buckets.items())
    if len(bounds) < 2 or not math.isinf(bounds[-1][0]) or bounds[-1][1] <= 0:
        return None
    rank = q * bounds[-1][1]
    b = next((i for i, (_, count) in enumerate(bounds[:-1]) if count >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2][0]
    end, count = bounds[b]
    if b == 0 and end <= 0:
        return end
    start = 0.0
    if b > 0:
        start, below = bounds[b - 1]
        count -= below
        rank -= below
    return start + (end - start) * (rank / count)


class WindowFigures(NamedTuple):
    hit_rate: float | None
    ttft_p50: float | None


def window_figures(
    conn: Connection, replica: str, from_ts: float, to_ts: float
) -> WindowFigures | None:
    """Hit rate and TTFT p50 over the whole of [from_ts, to_ts] (the deltas of every pair of
    consecutive scrapes in it, summed over engines, restarted pairs left out, as in
    `hit_rate_series`); None when the window holds no such pair (not scraped)."""
    t = schema.engine_samples
    query = (
        select(t)
        .where(t.c.replica == replica, t.c.ts >= from_ts, t.c.ts <= to_ts)
        .order_by(t.c.engine, t.c.ts)
    )
    total, pairs = _Interval(), 0
    previous: dict[str, Row[Any]] = {}
    for row in conn.execute(query):
        before, previous[row.engine] = previous.get(row.engine), row
        if before is not None and not _restarted(before, row):
            total.add(before, row)
            pairs += 1
    if pairs == 0:
        return None
    rate = total.hits / total.queries if total.queries > 0 else None
    return WindowFigures(rate, histogram_quantile(0.5, total.buckets))
