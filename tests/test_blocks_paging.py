"""GET /replicas/{r}/blocks pages through every (hash, tier, group) entry exactly once, also
when the same hash is cached in two tiers (vLLM's CPU offload stores GPU blocks' hashes) and a
page ends between them."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port
from tests.test_ingest import frames, payload, store


def stored_in(medium: str, *hashes: int) -> dict[str, Any]:
    return dict(store(*hashes), medium=medium)


def test_pages_end_between_two_tiers_holding_the_same_hash() -> None:
    collector = Collector(replica_streams("r", f"tcp://127.0.0.1:{free_port()}"))
    ingest = collector.ingests[StreamId("r", 0)]
    ingest.live_frames(frames(0, payload(stored_in("GPU", *range(1, 8)))), 0.0)
    ingest.live_frames(frames(1, payload(stored_in("CPU", *range(1, 8)))), 0.0)
    client = TestClient(create_app(ApiData(collector=collector), ApiSettings()))
    for limit in (1, 2, 3, 5, 13, 14, 100):
        seen: list[tuple[int, str]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
            body = client.get("/replicas/r/blocks", params=params).json()
            seen += [(item["hash"], item["medium"]) for item in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted((h, m) for h in range(1, 8) for m in ("GPU", "CPU")), limit
        assert len(seen) == len(set(seen)) == 14
