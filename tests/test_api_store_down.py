"""While the store does not answer, the live endpoints keep answering from the collector's maps;
what only the store knows fails with 503 `store_unavailable` in the one error shape.

The outage is real but private to the test: the SQLite store's folder is removed (and the
engine's idle connections closed), so every new connection fails to open the file. Stopping
the shared PostgreSQL server would disturb whoever else uses it; a PostgreSQL URL whose port
nothing listens on stands for a store that never answered. The live replica is the bundled
capture played through real ZMQ sockets into a real Collector.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kvscope.api.app import create_app
from kvscope.api.data import STREAMS_TTL_S, ApiData
from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import read_capture
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.demo_sources import bundled
from kvscope.lab.ports import free_port
from kvscope.storage.engine import make_engine, open_store
from kvscope.storage.writer import StoreWriter
from tests.http_support import Response

LIVE, STORED = StreamId("lab", 0), StreamId("old", 0)


def error_of(response: Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"status", "code", "message", "field"}
    return dict(body["error"])


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass
class Outage:
    client: TestClient
    data: ApiData
    collector: Collector
    clock: Clock
    store_dir: Path

    def store_goes_down(self) -> None:
        assert self.data.engine is not None
        shutil.rmtree(self.store_dir)
        self.data.engine.dispose()
        self.clock.now += STREAMS_TTL_S + 1  # the stream list is due to be read again


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[Outage]:
    records = list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))[:300]
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    engine = open_store(f"sqlite:///{store_dir / 's.sqlite'}")
    writer = StoreWriter(engine)
    stored = StreamIngest(STORED, can_replay=False, sink=writer)
    for record in records:  # a replica only the store knows: another collector wrote it
        stored.live_frames(record.frames, record.recv_ts)
    writer.close()

    source = CaptureSource(records)
    collector = Collector(
        replica_streams(LIVE.replica, source.endpoint, source.replay_endpoint),
        settings=CollectorSettings(replay_timeout_s=2.0),
    )
    collector.start()
    clock = Clock()
    data = ApiData(collector=collector, engine=engine, clock=clock)
    try:
        source.play()
        deadline = time.monotonic() + 30
        while collector.ingests[LIVE].last_seq != records[-1].seq:
            assert time.monotonic() < deadline, "the collector did not catch up"
            time.sleep(0.05)
        with TestClient(create_app(data), raise_server_exceptions=False) as client:
            yield Outage(client, data, collector, clock, store_dir)
    finally:
        collector.stop()
        source.close()


def test_live_endpoints_answer_through_an_outage(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    client = outage.client
    with outage.collector.lock:
        live_blocks = outage.collector.ingests[LIVE].map.totals().blocks
        prompt = next(
            list(e.token_ids)
            for t in outage.collector.ingests[LIVE].map.tables.values()
            for h in t.counts()
            if (e := t.entry(h)).token_ids is not None and e.parent is None
        )
    before = {r["replica"]: r for r in client.get("/replicas").json()}
    assert before["old"]["ranks"][0]["source"] == "store" and before["old"]["unavailable"] == []
    assert client.get("/readyz").status_code == 200

    outage.store_goes_down()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            replicas = client.get("/replicas")
            assert replicas.status_code == 200, replicas.text
            outage.clock.now += STREAMS_TTL_S + 1
    by_name = {r["replica"]: r for r in replicas.json()}
    assert by_name["lab"]["ranks"][0]["source"] == "live"
    assert by_name["lab"]["ranks"][0]["blocks"] == live_blocks
    assert by_name["old"]["ranks"] == []
    assert by_name["old"]["unavailable"][0]["rank"] == 0
    # The stream list was tried three times; the outage is logged once (rate-limited).
    assert len([r for r in caplog.records if "streams are those" in r.getMessage()]) == 1

    assert client.get("/replicas/lab").json()["ranks"][0]["blocks"] == live_blocks
    page = client.get("/replicas/lab/blocks", params={"limit": 10_000})
    assert page.status_code == 200 and len(page.json()["items"]) == live_blocks
    assert client.get("/replicas/lab/prefixes").status_code == 200
    assert client.get("/metrics").status_code == 200

    found = client.post("/lookup", json={"token_ids": prompt})
    assert found.status_code == 200, found.text
    assert found.json()["best"]["replica"] == "lab" and found.json()["best"]["tokens"] > 0
    assert found.json()["unavailable"] == [
        {"replica": "old", "rank": 0, "reason": "known only to the store, which does not answer"}
    ]

    # What only the store knows: the one error shape, 503, nothing of the error's text.
    store_only = [
        client.get("/replicas/old"),
        client.get("/replicas/old/blocks"),
        client.get("/replicas/lab/blocks", params={"at": time.time() - 60}),
        client.get("/replicas/lab/diff", params={"from": 1}),
        client.get("/replicas/lab/series", params={"metric": "stored"}),
        client.get("/resets"),
        client.get("/resets/1"),
    ]
    for response in store_only:
        error = error_of(response, 503)
        assert error["code"] == "store_unavailable", response.request.url
        assert "sqlite" not in response.text.lower() and "SELECT" not in response.text
    ready = error_of(client.get("/readyz"), 503)
    assert ready["code"] == "store_unavailable" and "store" in ready["message"]
    assert client.get("/healthz").status_code == 200


def test_a_reset_asked_for_while_the_store_is_down_says_it_is_not_recorded(
    outage: Outage, tmp_path: Path
) -> None:
    from kvscope.api.context import ApiSettings

    settings = ApiSettings(api_token="t", replica_urls={"lab": f"http://127.0.0.1:{free_port()}"})
    outage.store_goes_down()
    with TestClient(create_app(outage.data, settings), raise_server_exceptions=False) as client:
        response = client.post("/replicas/lab/reset", headers={"authorization": "Bearer t"})
    assert response.status_code == 200, response.text
    record = response.json()
    assert record["outcome"] == "unreachable" and not record["recorded"] and record["id"] == 0


def test_a_store_only_api_fails_whole_with_503(tmp_path: Path) -> None:
    """`kvscope api` has no live maps: while its store is down, everything it knows is the
    store's, and every answer but health is 503 (its list of streams it keeps, but cannot say
    anything about them)."""
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    engine = open_store(f"sqlite:///{store_dir / 's.sqlite'}")
    writer = StoreWriter(engine)
    ingest = StreamIngest(STORED, can_replay=False, sink=writer)
    for record in list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))[:100]:
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    clock = Clock()
    data = ApiData(engine=engine, clock=clock)
    with TestClient(create_app(data), raise_server_exceptions=False) as client:
        assert client.get("/replicas").status_code == 200
        shutil.rmtree(store_dir)
        engine.dispose()
        clock.now += STREAMS_TTL_S + 1
        for path in ("/replicas", "/replicas/old", "/replicas/old/blocks", "/resets"):
            assert error_of(client.get(path), 503)["code"] == "store_unavailable", path
        lookup = client.post("/lookup", json={"token_ids": [1, 2, 3]})
        assert error_of(lookup, 503)["code"] == "store_unavailable"


def test_a_store_that_never_answered_is_503_not_an_empty_list() -> None:
    """A PostgreSQL URL whose port nothing listens on: connection refused."""
    engine = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/kvscope")
    with TestClient(create_app(ApiData(engine=engine)), raise_server_exceptions=False) as client:
        for path in ("/replicas", "/replicas/a", "/resets"):
            response = client.get(path)
            assert error_of(response, 503)["code"] == "store_unavailable", path
            assert "psycopg" not in response.text and "127.0.0.1" not in response.text
        assert error_of(client.get("/readyz"), 503)["code"] == "store_unavailable"
