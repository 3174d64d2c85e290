"""The API on a real uvicorn over loopback, while vLLM's real Scheduler streams events.

The events come from a lab replica (vLLM's Scheduler with no model) stepped by the test; the
reset trigger calls that replica's vLLM-shaped HTTP API, whose resets run vLLM's own
`reset_prefix_cache` (default mode fails while blocks are held) and the keep-running reset.
vLLM's whole API server needs a model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.api.schemas import LookupResponse
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.metrics import METRICS
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.vllm_source import Source

pytestmark = pytest.mark.vllm
STREAM = StreamId("r1", 0)
TOKEN = "s3cret"


@dataclass
class Stack:
    url: str
    source: Source
    collector: Collector
    lock: threading.Lock
    """Held while the source steps or applies a reset: the engine resets between steps."""

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            with self.lock:
                self.source.step()

    def post_applying_resets(self, url: str, **kwargs: Any) -> httpx.Response:
        """POST `url` while the replica applies the resets it is asked for meanwhile (nobody
        else drives it), as the demo does."""
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, url, **kwargs)
            while not answer.done():
                with self.lock:
                    self.source.replica.apply_pending(timeout=0.02)
            return answer.result()

    def synced(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self.collector.lock:
                ingest = self.collector.ingests[STREAM]
                if ingest.last_seq == self.source.last_seq and not ingest.replaying:
                    return
            time.sleep(0.005)
        raise AssertionError("collector did not catch up")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as exits:
        port, replay_port = free_port(), free_port()
        source = Source.start(96, port, replay_port, seed=21, http_port=0)
        exits.callback(source.close)
        store = tmp_path_factory.mktemp("api") / "store.sqlite"
        writer = StoreWriter(open_store(f"sqlite:///{store}"), StoreSettings())
        exits.callback(writer.close)
        collector = Collector(
            replica_streams("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"),
            settings=CollectorSettings(replay_timeout_s=2.0),
            sink=writer,
        )
        collector.start()
        exits.callback(collector.stop)
        api_port = free_port()
        stack = Stack(f"http://127.0.0.1:{api_port}", source, collector, threading.Lock())
        settings = ApiSettings(
            api_token=TOKEN,
            replica_urls={"r1": str(source.replica.http_url)},
            link_window_s=30.0,
        )
        app = create_app(ApiData(collector, writer.engine, writer), settings)
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=api_port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        exits.callback(thread.join, 10)
        exits.callback(setattr, server, "should_exit", True)
        while not server.started:
            time.sleep(0.01)
        stack.step(150)
        stack.synced()
        yield stack


def get(stack: Stack, path: str, **params: object) -> httpx.Response:
    return httpx.get(stack.url + path, params=params, timeout=30)  # type: ignore[arg-type]


def recent_prompt(stack: Stack, back: int) -> list[int]:
    """The prompt of a recent request (`back` requests before the last one drawn)."""
    _, prompt = stack.source.replica.workload.recent_prompts[-1 - back]
    return prompt


def all_blocks(stack: Stack, **params: object) -> dict[int, int]:
    seen: dict[int, int] = {}
    cursor = None
    while True:
        page = get(
            stack,
            "/replicas/r1/blocks",
            limit=37,
            **params,
            **({"cursor": cursor} if cursor else {}),
        )
        assert page.status_code == 200, page.text
        body = page.json()
        for item in body["items"]:
            assert item["hash"] not in seen
            seen[item["hash"]] = item["count"]
        cursor = body["next_cursor"]
        if cursor is None:
            return seen


def test_replicas_and_blocks_are_the_live_map(stack: Stack) -> None:
    stack.step(40)
    stack.synced()
    with stack.lock:
        truth = {h: n for (h, _g), n in stack.source.truth_counts().items()}
    replicas = get(stack, "/replicas").json()
    (rank,) = replicas[0]["ranks"]
    assert replicas[0]["replica"] == "r1" and rank["source"] == "live" and rank["connected"]
    assert rank["blocks"] == len(truth) and rank["last_seq"] == stack.source.last_seq
    assert all_blocks(stack) == truth
    # The lab stamps batches on a simulated clock: its offset is reported apart from the age of
    # the last batch, which is on the collector's clock.
    with stack.collector.lock:
        ingest = stack.collector.ingests[STREAM]
        offset = ingest.last_message_at - ingest.map.counters.last_ts  # type: ignore[operator]
        stats = ingest.map.stats()
    assert rank["engine_clock_offset_s"] == pytest.approx(offset)
    assert rank["age_s"] >= 0 and "lag_s" not in rank
    tables = {(t["medium"], t["group"]): t for t in rank["tables"]}
    assert list(tables) == sorted(tables)  # by tier, then KV group
    assert {
        k: (t["blocks"], t["copies"], t["hittable"], t["orphans"]) for k, t in tables.items()
    } == {
        (k.medium, k.group): (s.blocks, s.copies, s.hittable, s.orphans) for k, s in stats.items()
    }


def test_the_past_comes_from_the_store(stack: Stack) -> None:
    stack.synced()
    with stack.collector.lock:
        ingest = stack.collector.ingests[STREAM]
        then, at = ingest.map.counts(), ingest.map.counters.last_ts
    stack.step(60)
    stack.synced()
    # No waiting here: the API waits for the batches the writer still holds (it lingers).
    past = all_blocks(stack, at=at)
    assert past == {h: n for (h, _g), n in then.items()}
    assert get(stack, "/replicas/r1/blocks", at=1.0).status_code == 404


def test_lookup_agrees_with_vllms_own_prefix_cache_lookup(stack: Stack) -> None:
    """Matching block contents gives what vLLM's hash lookup gives, prompt after prompt."""
    hits = 0
    for i in range(12):
        stack.step(3)
        stack.synced()
        with stack.lock:
            # A recent prompt, plus one token so that vLLM's cap (num_tokens - 1) never bites.
            prompt = [*recent_prompt(stack, i % 4), 7]
            engine = stack.source.replica.engine
            request = engine.make_request(f"lookup-{i}", prompt, max_tokens=1)
            _, vllm_tokens, _ = engine.scheduler.kv_cache_manager.get_computed_blocks(request)
            response = httpx.post(stack.url + "/lookup", json={"token_ids": prompt}, timeout=30)
        assert response.status_code == 200, response.text
        answer = LookupResponse.model_validate_json(response.content)  # encoded without it
        most = max(answer.matches, key=lambda m: (m.tokens, m.medium == "GPU"))
        assert answer.best == (most if most.tokens else None)
        assert (answer.best.tokens if answer.best else 0) == vllm_tokens, (i, prompt)
        hits += vllm_tokens > 0
    assert hits >= 6


def test_a_lookup_waits_for_ingest_in_a_worker_not_in_the_event_loop(stack: Stack) -> None:
    """While ingest holds the maps, a lookup waits for them off the event loop: other requests
    are answered meanwhile, and the lookup's answer is the one it would have been."""
    stack.step(3)
    stack.synced()
    body = {"token_ids": [*recent_prompt(stack, 0), 7]}
    before = httpx.post(stack.url + "/lookup", json=body, timeout=30)
    with ThreadPoolExecutor(1) as pool:
        with stack.collector.lock:  # as the collector's loop holds it while it applies batches
            waiting = pool.submit(httpx.post, stack.url + "/lookup", json=body, timeout=30)
            time.sleep(0.3)
            assert not waiting.done()
            assert httpx.get(stack.url + "/healthz", timeout=5).status_code == 200
        assert waiting.result().content == before.content


def test_metrics_expose_every_documented_name(stack: Stack) -> None:
    text = get(stack, "/metrics").text
    families = {f.name for f in text_string_to_metric_families(text)}
    documented = {spec.name.removesuffix("_total") for spec in METRICS}
    assert documented <= families
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("replica") == "r1" and s.labels.get("medium", "GPU") == "GPU"
    }
    assert samples["kvscope_stream_connected"] == 1.0
    assert samples["kvscope_ingest_batches_total"] > 100


@pytest.mark.parametrize(
    ("path", "params", "status", "field"),
    [
        ("/replicas/nope", {}, 404, None),
        ("/replicas/r1/blocks", {"limit": 0}, 422, "limit"),
        ("/replicas/r1/blocks", {"tier": "DISK"}, 422, "tier"),
        ("/replicas/r1/blocks", {"cursor": "abc"}, 422, "cursor"),
        ("/replicas/r1/blocks", {"rank": 5}, 404, None),
        ("/resets/999999", {}, 404, None),
    ],
)
def test_errors_have_one_shape(
    stack: Stack, path: str, params: dict[str, object], status: int, field: str | None
) -> None:
    response = get(stack, path, **params)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"status", "code", "message", "field"} and error["status"] == status
    assert error["field"] == field


def test_oversized_bodies_are_refused(stack: Stack) -> None:
    body = b'{"token_ids": [' + b"1," * 5_000_000 + b"1]}"
    response = httpx.post(
        stack.url + "/lookup",
        content=body,
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"


def test_resets_through_kvscope_are_labelled_with_mode_and_outcome(stack: Stack) -> None:
    def reset(*modes: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return stack.post_applying_resets(
            stack.url + "/replicas/r1/reset",
            params=[("mode", m) for m in modes],
            headers=headers,
            timeout=30,
        )

    assert reset("keep", token=None).status_code == 401
    assert reset("keep", token="wrong").status_code == 401
    assert reset("keep", "preempt").status_code == 400
    stack.step(5)
    refused = reset("default")  # requests are running: vLLM says no
    assert refused.status_code == 200 and refused.json()["outcome"] == "refused"
    kept = reset("keep")
    assert kept.json()["outcome"] == "success"
    stack.step(30)
    stack.synced()
    time.sleep(0.5)
    resets = get(stack, "/resets", replica="r1").json()
    assert resets and resets[-1]["mode"] == "keep"
    assert resets[-1]["request"]["id"] == kept.json()["id"]
    detail = get(stack, f"/resets/{resets[-1]['id']}").json()
    assert detail["before_tables"][0]["blocks"] == resets[-1]["before_blocks"] > 0
    for name in ("hittable", "orphans"):
        assert sum(t[name] for t in detail["before_tables"]) == resets[-1][f"before_{name}"]
    text = get(stack, "/metrics").text
    assert 'kvscope_resets_requested_total{mode="keep",outcome="success",replica="r1"} 1.0' in text


def test_health_and_readiness(stack: Stack) -> None:
    assert get(stack, "/healthz").json() == {"status": "ok", "detail": ""}
    assert get(stack, "/readyz").status_code == 200


def test_mutating_endpoints_are_disabled_without_a_token(tmp_path: Path) -> None:
    app = create_app(ApiData(engine=open_store(f"sqlite:///{tmp_path / 's.sqlite'}")))
    from fastapi.testclient import TestClient

    client = TestClient(app)
    response = client.post("/replicas/r1/reset", headers={"authorization": "Bearer x"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "disabled"


def test_prefixes_diff_and_series(stack: Stack) -> None:
    stack.synced()
    with stack.collector.lock:
        then = stack.collector.ingests[STREAM].map.counters.last_ts
        before = {h for h, _ in stack.collector.ingests[STREAM].map.counts()}
    stack.step(40)
    stack.synced()
    time.sleep(0.3)
    with stack.collector.lock:
        now = {h for h, _ in stack.collector.ingests[STREAM].map.counts()}
    shape = get(stack, "/replicas/r1/prefixes").json()
    gpu = shape["tables"][0]
    assert gpu["blocks"] == len(now) and gpu["roots"] >= 1
    assert sum(gpu["chain_lengths"].values()) >= gpu["roots"]
    assert gpu["largest_prefixes"][0]["tokens"] == 16 * gpu["largest_prefixes"][0]["blocks"]
    changes = get(stack, "/replicas/r1/diff", **{"from": then, "limit": 10_000}).json()
    assert set(changes["stored_hashes"]) == now - before
    assert set(changes["removed_hashes"]) == before - now
    assert changes["kept"] == len(now & before)
    series = get(stack, "/replicas/r1/series", metric="stores", step=1).json()
    assert series["series"] and sum(p["value"] for p in series["series"][0]["points"]) > 0
    assert get(stack, "/replicas/r1/series", metric="nope").status_code == 422
