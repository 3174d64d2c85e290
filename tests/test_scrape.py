"""Scraping vLLM's own /metrics into the store, on a real SQLite file and the real PostgreSQL.

The exposition is vLLM's: its `PrometheusStatLogger` (the class behind a server's /metrics,
built here from a `VllmConfig` over a 2-layer Llama config.json, no weights) records
`SchedulerStats` / `IterationStats` and prometheus_client renders its registry. A stdlib HTTP
server on 127.0.0.1 serves that text, since vLLM's API server needs a model to run. An engine
restart is a fresh `PrometheusStatLogger`, whose counters start again from 0, as they do.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import prometheus_client
import pytest
from sqlalchemy import func, select

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from vllm.config import ModelConfig, VllmConfig
from vllm.v1.metrics.buckets import TIME_TO_FIRST_TOKEN_BUCKETS
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.prometheus import unregister_vllm_metrics
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from kvscope.lab.engine_build import TINY_LLAMA
from kvscope.lab.ports import free_port
from kvscope.storage import schema
from kvscope.storage.engine import make_engine, open_store
from kvscope.storage.scrape import (
    EngineSample,
    HitRatePoint,
    MetricsScraper,
    ScrapeError,
    hit_rate_series,
    parse_vllm_metrics,
)

pytestmark = pytest.mark.vllm

HTML = "<!DOCTYPE html>\n<html><body>Not Found</body></html>\n"


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory: pytest.TempPathFactory) -> VllmConfig:
    model = tmp_path_factory.mktemp("tiny-llama")
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    return VllmConfig(
        model_config=ModelConfig(
            model=str(model),
            served_model_name="tiny",
            skip_tokenizer_init=True,
            dtype="float16",
            max_model_len=1024,
        )
    )


class Exporter:
    """A vLLM server's metrics with two engines (DP ranks 0 and 1)."""

    def __init__(self, config: VllmConfig) -> None:
        self._config = config
        self.restart()

    def restart(self) -> None:
        self._logger = PrometheusStatLogger(self._config, engine_indexes=[0, 1])

    def step(
        self,
        engine: int,
        queries: int = 0,
        hits: int = 0,
        preempted: int = 0,
        running: int = 0,
        waiting: int = 0,
        usage: float = 0.0,
        ttfts: Iterable[float] = (),
    ) -> None:
        scheduler = SchedulerStats(
            num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage
        )
        scheduler.prefix_cache_stats.queries = queries
        scheduler.prefix_cache_stats.hits = hits
        iteration = IterationStats()
        iteration.num_preempted_reqs = preempted
        iteration.time_to_first_tokens_iter = list(ttfts)
        self._logger.record(scheduler, iteration, engine_idx=engine)

    def body(self) -> str:
        return prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()


@pytest.fixture
def exporter(vllm_config: VllmConfig) -> Iterator[Exporter]:
    yield Exporter(vllm_config)
    unregister_vllm_metrics()


class MetricsServer:
    """/metrics answers `body`; /html a web page; /boom a 500."""

    def __init__(self) -> None:
        self.body = ""
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/boom":
                    self.send_error(500)
                    return
                body = (HTML if self.path == "/html" else state.body).encode()
                self.send_response(200)
                self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    served = MetricsServer()
    yield served
    served.close()


def near(value: float) -> float:
    """pytest.approx(value), typed as the float it stands in for."""
    return cast(float, pytest.approx(value))


def cumulative(observations: list[float]) -> dict[float, float]:
    return {
        le: float(sum(1 for x in observations if x <= le))
        for le in (*TIME_TO_FIRST_TOKEN_BUCKETS, math.inf)
    }


# --- parsing ------------------------------------------------------------------------------------
def test_vllm_exposition_gives_one_sample_per_engine(exporter: Exporter) -> None:
    observed = [0.03, 0.2, 3.0]
    exporter.step(0, 300, 120, preempted=2, running=3, waiting=1, usage=0.25, ttfts=observed)
    exporter.step(1, 64, running=1, usage=0.5)
    e0, e1 = parse_vllm_metrics(exporter.body(), ts=7.0)
    assert e0.ttft_sum == pytest.approx(3.23)
    assert e0 == EngineSample(
        7.0, "0", 300, 120, 2, 3, 1, 0.25, e0.ttft_sum, 3, cumulative(observed)
    )
    assert e1 == EngineSample(7.0, "1", 64, 0, 0, 1, 0, 0.5, 0, 0, cumulative([]))
    assert list(e0.ttft_buckets)[-1] == math.inf


def test_missing_metrics_are_none_and_labels_other_than_engine_are_summed() -> None:
    body = (
        'vllm:num_requests_running{model_name="a"} 2\n'
        'vllm:num_requests_waiting{engine="3",model_name="a"} 1\n'
        'vllm:num_requests_waiting{engine="3",model_name="b"} 2\n'
        "vllm:something_newer_total 5\n"
    )
    assert parse_vllm_metrics(body, ts=1.0) == [
        EngineSample(1.0, "0", running=2.0),
        EngineSample(1.0, "3", waiting=3.0),
    ]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (HTML, "not Prometheus text"),
        ('{"detail": "Not Found"}', "not Prometheus text"),
        ("Internal Server Error", "not Prometheus text"),
        ("", "no vllm: samples"),
        ('python_gc_objects_collected_total{generation="0"} 5.0\n', "no vllm: samples"),
    ],
)
def test_a_body_that_is_not_vllm_metrics_is_a_clear_error(body: str, match: str) -> None:
    with pytest.raises(ScrapeError, match=match):
        parse_vllm_metrics(body)


# --- scraping into the store ----------------------------------------------------------------------
def test_scrapes_become_rows_and_the_hit_rate_series(
    store_url: str, exporter: Exporter, server: MetricsServer
) -> None:
    now: list[float] = []
    scraper = MetricsScraper(open_store(store_url), {"r1": server.url + "/metrics"}, clock=now.pop)

    def scrape_at(ts: float) -> None:
        now.append(ts)
        server.body = exporter.body()
        assert scraper.scrape_once() == 2

    exporter.step(0, 100, 20, ttfts=[0.03])
    exporter.step(1, 50, 0)
    scrape_at(100.0)
    ttfts = [0.2, 0.2, 0.6, 0.6]
    exporter.step(0, 200, 150, preempted=1, running=4, waiting=2, usage=0.5, ttfts=ttfts)
    exporter.step(1, 100, 50)
    scrape_at(105.0)
    exporter.restart()  # both engines' counters fall back to 0
    exporter.step(0, 40, 10)
    exporter.step(1, 8, 0)
    scrape_at(110.0)
    exporter.step(0, 100, 90)
    exporter.step(1, ttfts=[2.0])
    scrape_at(115.0)
    scrape_at(120.0)  # no traffic
    assert scraper.errors == {} and scraper.scrapes == {"r1": 5}

    engine_samples = schema.engine_samples
    with open_store(store_url).connect() as conn:
        count = select(func.count()).select_from(engine_samples)
        assert conn.execute(count).scalar() == 10
        row = conn.execute(
            select(engine_samples).where(engine_samples.c.engine == "0", engine_samples.c.ts == 105)
        ).one()
        assert (row.replica, row.prefix_cache_queries, row.prefix_cache_hits) == ("r1", 300, 170)
        assert (row.preemptions, row.running, row.waiting, row.kv_usage) == (1, 4, 2, 0.5)
        assert (row.ttft_count, row.ttft_sum) == (5, pytest.approx(1.63))

        # 105: hits (150 + 50) / queries (200 + 100); TTFTs 0.2 0.2 in (0.1, 0.25] and 0.6 0.6 in
        # (0.5, 0.75]: p50 = 0.1 + 0.15 * 2/2, p99 = 0.5 + 0.25 * (3.96 - 2)/2.
        # 110: every engine restarted, no point. 115: 90 / 100; one TTFT, 2.0 in (1.0, 2.5]:
        # p50 = 1.0 + 1.5 * 0.5, p99 = 1.0 + 1.5 * 0.99. 120: nothing happened.
        assert hit_rate_series(conn, "r1", 0, 1e9) == [
            HitRatePoint(105.0, near(2 / 3), near(0.25), near(0.745)),
            HitRatePoint(115.0, near(0.9), near(1.75), near(2.485)),
            HitRatePoint(120.0, None, None, None),
        ]
        assert hit_rate_series(conn, "r1", 0, 1e9, engine="1") == [
            HitRatePoint(105.0, 0.5, None, None),
            HitRatePoint(115.0, None, near(1.75), near(2.485)),
            HitRatePoint(120.0, None, None, None),
        ]
        # Each engine's first sample in the window is its baseline.
        assert [p.ts for p in hit_rate_series(conn, "r1", 105, 120)] == [115.0, 120.0]
        assert hit_rate_series(conn, "other", 0, 1e9) == []


def test_failures_are_counted_and_scraping_goes_on(
    store_url: str,
    exporter: Exporter,
    server: MetricsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter.step(0, 10, 5)
    server.body = exporter.body()
    targets = {
        "good": server.url + "/metrics",
        "html": server.url + "/html",
        "boom": server.url + "/boom",
        "down": f"http://127.0.0.1:{free_port()}/metrics",
    }
    failing = [r for r in targets if r != "good"]
    engine = open_store(store_url)
    scraper = MetricsScraper(engine, targets, interval_s=0.02, timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger="kvscope.storage.scrape"):
        scraper.start()
        deadline = time.monotonic() + 20
        while scraper.scrapes["good"] < 5 or min(scraper.errors[r] for r in failing) < 5:
            assert time.monotonic() < deadline, (scraper.scrapes, scraper.errors)
            time.sleep(0.02)
        scraper.stop()

    assert scraper.errors["good"] == 0
    assert "not Prometheus text" in scraper.last_error["html"]
    assert "HTTP Error 500" in scraper.last_error["boom"]
    assert targets["down"] in scraper.last_error["down"]
    # Logged once per failing replica (then held back for 10 s), never per failure.
    logged = [  # "scraping REPLICA failed: ..."
        r.getMessage().split()[1] for r in caplog.records if r.name == "kvscope.storage.scrape"
    ]
    assert sorted(logged) == sorted(failing)

    count = select(func.count()).select_from(schema.engine_samples)
    with engine.connect() as conn:
        stored = conn.execute(count).scalar()
        replicas = conn.execute(select(schema.engine_samples.c.replica).distinct()).scalars()
        assert set(replicas) == {"good"}
    assert stored == scraper.scrapes["good"] * 2
    time.sleep(0.1)  # stopped: nothing more is written
    with engine.connect() as conn:
        assert conn.execute(count).scalar() == stored

    # A replica that answers properly again is scraped again.
    scraper.targets["html"] = server.url + "/metrics"
    assert scraper.scrape_once() == 4 and scraper.scrapes["html"] == 1


def test_a_store_that_is_down_is_counted_too(
    tmp_path: Path, exporter: Exporter, server: MetricsServer
) -> None:
    exporter.step(1, 10, 5)
    server.body = exporter.body()
    unwritable = make_engine(f"sqlite:///{tmp_path / 'missing' / 'kvscope.sqlite'}")
    scraper = MetricsScraper(unwritable, {"r1": server.url + "/metrics"})
    assert scraper.scrape_once() == 0 and scraper.scrape_once() == 0
    assert scraper.errors == {"r1": 2} and "unable to open" in scraper.last_error["r1"]
