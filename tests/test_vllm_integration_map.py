"""The collector against vLLM itself: its map must equal vLLM's BlockPool, hash for hash.

Every test runs vLLM's real Scheduler, KVCacheManager and ZmqEventPublisher (a lab replica, see
`vllm_source.py`) and the real `Collector` over TCP loopback, drives a seeded load, and at many
checkpoints waits until the collector has applied every published batch, then compares its map
with the pool's.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from vllm.distributed.kv_events import KVEventBatch

from kvscope.collector.sink import ClearReason
from kvscope.lab.ports import free_port, free_port_run
from tests import vllm_integration_support as vi

pytestmark = pytest.mark.vllm


# --- the tests ----------------------------------------------------------------------------------
def test_random_workload_with_resets_and_eviction(stack: ExitStack) -> None:
    """Shared prefixes, eviction, duplicates, and all three resets: exact at every checkpoint."""
    port, replay_port = free_port(), free_port()
    source = vi.start_source(stack, port, replay_port, seed=1234, resets=vi.RESETS)
    recorder = vi.ClearRecorder()
    collector = vi.start_collector(stack, vi.tcp(port), vi.tcp(replay_port), sink=recorder)

    checkpoints = orphan_checkpoints = duplicate_checkpoints = 0
    max_orphans = 0
    for step in range(480):
        source.step()
        if step % 4 == 3:
            totals = vi.assert_exact(collector, vi.RANK0, source)
            checkpoints += 1
            max_orphans = max(max_orphans, totals.orphans)
            orphan_checkpoints += totals.orphans > 0
            duplicate_checkpoints += totals.copies > totals.blocks
    totals = vi.assert_exact(collector, vi.RANK0, source)

    stats = source.stats
    # The load did what it is for.
    assert stats["reset_keep_with_running"] >= 3, stats
    assert stats["reset_preempt"] >= 2, stats
    assert stats["reset_default_ok"] >= 2 and stats["reset_default_failed"] >= 2, stats
    assert source.replica.preemptions > 0, "the KV cache should have run out"
    assert source.prefix_cache_hits > 0
    assert source.events["BlockRemoved"] > 0, source.events  # eviction happened
    assert duplicate_checkpoints > 0, "no hash was ever cached twice"
    # Keep-running resets leave stored blocks whose parent is gone: the collector keeps them.
    assert orphan_checkpoints > 0 and max_orphans > 0
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        counters = ingest.counters
        assert ingest.degraded is None and not ingest.degraded_history
        assert counters.gaps == 0 and counters.restarts == 0 and not counters.malformed
        assert counters.batches_applied == source.batches
        assert ingest.map.counters.clears == source.events["AllBlocksCleared"]
        assert len(recorder.cleared) == source.events["AllBlocksCleared"]
        assert all(c.reason is ClearReason.ALL_BLOCKS_CLEARED for c in recorder.cleared)
        assert all(c.stream == vi.RANK0 and c.epoch == 0 for c in recorder.cleared)
    assert checkpoints >= 100


def test_two_dp_ranks_are_separate_streams(stack: ExitStack) -> None:
    """Two ranks on base port + rank: only rank 0 resets; rank 1's map is untouched by it."""
    port = free_port_run(2)
    replay_port = free_port_run(2, exclude=(port, port + 1))
    rank0 = vi.start_source(
        stack, port, replay_port, seed=10, resets=vi.DP0_RESETS, rank=0, name="dp0"
    )
    rank1 = vi.start_source(stack, port, replay_port, seed=11, rank=1, num_blocks=48, name="dp1")
    recorder = vi.ClearRecorder()
    collector = vi.start_collector(
        stack, vi.tcp(port), vi.tcp(replay_port), dp_ranks=2, sink=recorder
    )

    for step in range(240):
        rank0.step()
        rank1.step()
        if step % 4 == 3:
            vi.assert_exact(collector, vi.RANK0, rank0)
            vi.assert_exact(collector, vi.RANK1, rank1)
    vi.assert_exact(collector, vi.RANK0, rank0)
    vi.assert_exact(collector, vi.RANK1, rank1)

    assert rank0.events["AllBlocksCleared"] >= 3 and rank1.events["AllBlocksCleared"] == 0
    with collector.lock:
        ingest0, ingest1 = collector.ingests[vi.RANK0], collector.ingests[vi.RANK1]
        assert ingest0.map.counters.clears == rank0.events["AllBlocksCleared"]
        assert ingest1.map.counters.clears == 0
        assert {c.stream for c in recorder.cleared} == {vi.RANK0}
        for ingest, source in ((ingest0, rank0), (ingest1, rank1)):
            assert ingest.counters.batches_applied == source.batches
            assert ingest.counters.rank_mismatches == 0
            assert ingest.degraded is None and ingest.counters.gaps == 0
        assert ingest1.map.totals().blocks > 0


def test_bytes_block_hashes(stack: ExitStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """With VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 events carry raw sha256 bytes."""
    # vllm.envs reads the variable on every access (no env cache outside a running engine).
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    port, replay_port = free_port(), free_port()
    source = vi.start_source(stack, port, replay_port, seed=21, resets=vi.RESETS)
    hash_types: set[type] = set()

    def look(seq: int, batch: KVEventBatch) -> None:
        for event in batch.events:
            hash_types.update(type(h) for h in getattr(event, "block_hashes", ()))

    source.replica.batch_observers.append(look)
    collector = vi.start_collector(stack, vi.tcp(port), vi.tcp(replay_port))
    for step in range(240):
        source.step()
        if step % 4 == 3:
            vi.assert_exact(collector, vi.RANK0, source)
    vi.assert_exact(collector, vi.RANK0, source)

    assert hash_types == {bytes}
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        assert ingest.degraded is None and not ingest.counters.malformed
        (table,) = ingest.map.tables.values()
        raw = {h: table.raw_hash(h) for h in table.counts()}
    assert raw and all(r is not None and len(r) == 32 for r in raw.values())
    assert all(int.from_bytes(r, "big") & (2**64 - 1) == h for h, r in raw.items() if r)
