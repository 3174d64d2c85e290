"""For the lab tests: a collector on a lab replica's streams, held exactly to vLLM's BlockPool."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from vllm.v1.request import Request

from kvscope.collector.discovery import discover
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.replica import LabReplica
from tests.vllm_integration_support import wait_for

pytestmark = pytest.mark.vllm

BLOCK = 16


# --- helpers ------------------------------------------------------------------------------------
def start_collector(replica: LabReplica) -> tuple[Collector, StreamId]:
    """A collector on the streams the replica's /kv_event_sources lists, past its first replay."""
    assert replica.http_url is not None
    streams = discover(replica.name, replica.http_url)
    collector = Collector(streams, settings=CollectorSettings(replay_timeout_s=2.0))
    collector.start()
    stream = streams[0].stream
    wait_for(
        collector,
        lambda: (
            collector.is_connected(stream)
            and collector.ingests[stream].counters.replays_ok >= 1
            and not collector.ingests[stream].replaying
        ),
        lambda: f"{stream} ready",
    )
    return collector, stream


def assert_exact(collector: Collector, stream: StreamId, replica: LabReplica) -> int:
    """Wait until the collector applied every published batch; its map must be the BlockPool's.

    Returns the collector's orphan count (stored blocks whose parent is not cached).
    """
    last_seq = replica.last_seq
    ingest = collector.ingests[stream]
    wait_for(
        collector,
        lambda: ingest.last_seq == last_seq and not ingest.replaying,
        lambda: f"seq {last_seq}: at {ingest.last_seq}, counters {ingest.counters}",
    )
    want = replica.truth_counts()
    with collector.lock:
        got = ingest.map.counts()
        orphans = ingest.map.totals().orphans
        assert ingest.degraded is None
    assert got == want, f"collector {len(got)} hashes, BlockPool {len(want)} at seq {last_seq}"
    return orphans


def computed_tokens(requests: list[Request]) -> dict[str, int]:
    return {r.request_id: r.num_computed_tokens for r in requests}


def will_fill_a_block(request: Request) -> bool:
    """Running in decode, with at least one more full block to write before it finishes."""
    params = request.sampling_params
    assert params is not None and params.max_tokens is not None
    left = params.max_tokens - request.num_output_tokens
    return request.num_computed_tokens >= request.num_prompt_tokens and left > BLOCK + 1


def http(method: str, url: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return status, json.loads(body) if body else None
