"""The lab: vLLM's real v1 Scheduler with no model, its resets, its API, its recordings.

Every test drives `LabReplica` (vLLM 0.33's own Scheduler, KVCacheManager, BlockPool and
ZmqEventPublisher on CPU) in simulated time as fast as it goes, and holds it to vLLM's own
BlockPool: the collector, fed over real sockets, must equal `cached_block_hash_to_block` at
every checkpoint; a recording must replay to the ground truth written beside it.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
import vllm
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.v1.request import RequestStatus

from kvscope.collector.discovery import discover
from kvscope.collector.types import StreamId
from kvscope.lab.replica import LabReplica
from kvscope.lab.workload import (
    ResetMode,
    WorkloadSpec,
)
from kvscope.storage.scrape import parse_vllm_metrics
from tests.lab_support import (
    assert_exact,
    computed_tokens,
    http,
    start_collector,
    will_fill_a_block,
)

pytestmark = pytest.mark.vllm

SYNC_TIMEOUT_S = 10.0
BLOCK = 16


@pytest.fixture
def replica() -> Iterator[LabReplica]:
    lab = LabReplica("lab", WorkloadSpec(rate=4.0, seed=11))
    yield lab
    lab.close()


# --- the tests ----------------------------------------------------------------------------------
def test_resets_in_three_modes_and_the_collector_follows(replica: LabReplica) -> None:
    """Default fails under load, preempt preempts everyone, keep keeps everyone and leaves
    orphans; the collector equals the BlockPool at every checkpoint throughout."""
    collector, stream = start_collector(replica)
    try:
        stored_parents: list[tuple[int, int | None, bool]] = []

        def observe(seq: int, batch: KVEventBatch) -> None:
            # (seq, parent, parent cached when published), for the keep reset's orphans
            cached = {h for h, _ in replica.truth_counts()}
            for event in batch.events:
                if isinstance(event, BlockStored):
                    parent = event.parent_block_hash
                    assert parent is None or isinstance(parent, int)
                    stored_parents.append((seq, parent, parent in cached))

        replica.batch_observers.append(observe)
        checkpoints = 0
        for _ in range(8):
            replica.run_for(2.5)
            assert_exact(collector, stream, replica)
            checkpoints += 1
        assert replica.events["BlockRemoved"] > 0, "the workload should evict"

        # Default: fails while requests hold blocks, emits nothing, changes nothing.
        assert replica.run_until(lambda: replica.num_running >= 2, max_seconds=60)
        before = replica.truth_counts()
        held = replica.held_blocks
        record = replica.reset(ResetMode.DEFAULT)
        assert record.result is False and record.running_before >= 2
        assert record.held_blocks_before == held > 0 and record.held_blocks_unchanged
        assert record.pending_events_after == 0 and record.preempted == 0
        assert replica.truth_counts() == before
        replica.run_for(1.0)
        assert record.cleared_in_seq is None
        assert_exact(collector, stream, replica)

        # Preempt: every running request is preempted (its computed tokens thrown away).
        replica.run_for(5.0)
        assert replica.run_until(lambda: replica.num_running >= 2, max_seconds=60)
        running = replica.running_requests
        lost = sum(computed_tokens(running).values())
        record = replica.reset(ResetMode.PREEMPT)
        assert record.result is True
        assert record.preempted == record.running_before == len(running) >= 2
        assert record.running_after == 0 and record.waiting_after >= len(running)
        assert record.computed_tokens_lost == lost > 0
        assert all(r.status == RequestStatus.PREEMPTED for r in running)
        assert all(r.num_computed_tokens == 0 for r in running)
        assert record.held_blocks_after == 0 and record.hashed_blocks_after == 0
        assert record.pending_events_after == 1 and replica.truth_counts() == {}
        replica.step()  # the AllBlocksCleared goes out with the next step
        assert record.cleared_in_seq == replica.cleared_seqs[-1]
        assert_exact(collector, stream, replica)
        with collector.lock:
            assert collector.ingests[stream].map.counters.clears == 1

        # Keep: nothing preempted; running requests keep their blocks and computed tokens.
        replica.run_for(5.0)
        assert replica.run_until(
            lambda: (
                replica.num_running >= 2
                and any(will_fill_a_block(r) for r in replica.running_requests)
            ),
            max_seconds=60,
        )
        running = replica.running_requests
        tokens = computed_tokens(running)
        cached_before = {h for h, _ in replica.truth_counts()}
        record = replica.reset(ResetMode.KEEP)
        assert record.result is True and record.preempted == 0
        assert record.running_after == record.running_before == len(running)
        assert computed_tokens(replica.running_requests) == tokens
        assert all(r.status == RequestStatus.RUNNING for r in running)
        assert record.running_computed_tokens_after == record.running_computed_tokens_before
        assert record.held_blocks_unchanged and record.held_blocks_before > 0
        assert record.hashed_blocks_after == 0 and replica.truth_counts() == {}
        assert record.pending_events_after == 1
        seq_of_reset = replica.batches_published  # the clear travels in this batch
        max_orphans = 0
        for _ in range(10):
            replica.run_for(0.5)
            max_orphans = max(max_orphans, assert_exact(collector, stream, replica))
            checkpoints += 1
        assert record.cleared_in_seq == seq_of_reset
        # Later stores chain onto blocks the reset cleared: their parent is no longer cached.
        orphaned = [
            parent
            for seq, parent, cached in stored_parents
            if seq > seq_of_reset and parent in cached_before and not cached
        ]
        assert orphaned, "a running request should have stored a block after the keep reset"
        assert max_orphans > 0, "the collector should hold the orphaned stores"

        for _ in range(6):
            replica.run_for(3.0)
            assert_exact(collector, stream, replica)
            checkpoints += 1
        assert checkpoints >= 24
        with collector.lock:
            ingest = collector.ingests[stream]
            assert ingest.counters.gaps == 0 and ingest.counters.restarts == 0
            assert ingest.counters.batches_applied == replica.batches_published
            assert ingest.map.counters.clears == 2
        assert [r.mode for r in replica.resets] == [
            ResetMode.DEFAULT,
            ResetMode.PREEMPT,
            ResetMode.KEEP,
        ]
    finally:
        collector.stop()


def test_http_api_is_shaped_like_vllms(replica: LabReplica) -> None:
    """Resets over HTTP are applied by the engine thread between steps; metrics and sources."""
    url = replica.http_url
    assert url is not None
    replica.start()  # its own thread, as fast as it goes
    try:
        time.sleep(0.3)
        reset = f"{url}/reset_prefix_cache"
        status, body = http("POST", f"{reset}?reset_running_requests=true&keep_running_requests=1")
        assert status == 400 and "cannot be combined" in body["detail"]
        status, body = http("POST", f"{url}/reset_prefix_cache?reset_running_requests=maybe")
        assert status == 422
        assert replica.resets == []  # neither reached the engine

        status, body = http("POST", f"{url}/reset_prefix_cache")
        assert status == 200 and set(body) == {"success"}
        default = replica.resets[-1]
        assert default.mode == ResetMode.DEFAULT and default.source == "http"
        assert body["success"] is default.result is (default.held_blocks_before == 0)

        status, body = http("POST", f"{url}/reset_prefix_cache?reset_running_requests=true")
        assert (status, body) == (200, {"success": True})
        preempt = replica.resets[-1]
        assert preempt.mode == ResetMode.PREEMPT and preempt.preempted == preempt.running_before
        assert preempt.running_after == 0

        status, body = http(
            "POST", f"{url}/reset_prefix_cache?keep_running_requests=true&reset_external=true"
        )
        assert (status, body) == (200, {"success": True})
        keep = replica.resets[-1]
        assert keep.mode == ResetMode.KEEP and keep.reset_external
        assert keep.preempted == 0 and keep.running_after == keep.running_before

        assert http("GET", f"{url}/nothing-here")[0] == 404
        assert http("GET", f"{url}/version") == (200, {"version": vllm.__version__})

        time.sleep(0.3)
        with urllib.request.urlopen(f"{url}/metrics", timeout=20) as response:
            assert response.headers["content-type"].startswith("text/plain")
            text = response.read().decode()
        (engine,) = parse_vllm_metrics(text, ts=1.0)
        assert engine.engine == "0"
        assert engine.prefix_cache_queries is not None and engine.prefix_cache_hits is not None
        assert engine.prefix_cache_queries >= engine.prefix_cache_hits > 0
        assert engine.ttft_count is not None and engine.ttft_count > 0
        assert engine.ttft_sum is not None and engine.ttft_sum > 0
        assert list(engine.ttft_buckets)[-1] == math.inf
        assert engine.kv_usage is not None and 0.0 <= engine.kv_usage <= 1.0
        assert engine.running is not None and engine.waiting is not None
        assert engine.preemptions is not None
        assert 'model_name="lab"' in text

        status, sources = http("GET", f"{url}/kv_event_sources")
        assert status == 200 and list(sources) == ["0"]
        assert sources["0"]["endpoint"] == replica.endpoint
        assert sources["0"]["enable_kv_cache_events"] is True
        (spec,) = discover("lab", url)
        assert spec.stream == StreamId("lab", 0)
        assert spec.endpoint == replica.connect_endpoint and not spec.bind
        assert spec.replay_endpoint == replica.replay_connect_endpoint
        assert spec.topic == b"kv-events"
    finally:
        replica.close()
    assert replica.steps > 0 and replica.sim_t > 1.0
