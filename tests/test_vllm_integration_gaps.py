"""Against vLLM itself: lost batches are replayed; a gap that cannot be degrades until a reset."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from kvscope.lab.ports import free_port
from tests import vllm_integration_support as vi
from tests.vllm_source import LossyForwarder

pytestmark = pytest.mark.vllm


def test_lost_batches_are_replayed(stack: ExitStack) -> None:
    """Batches dropped between publisher and collector come back by replay: exact, not degraded."""
    port, replay_port, proxy_port = free_port(), free_port(), free_port()
    source = vi.start_source(stack, port, replay_port, seed=99, resets=vi.RESETS)

    def drop(seq: int) -> bool:
        return seq % 13 == 6 or 40 <= seq <= 44

    proxy = LossyForwarder(vi.tcp(port), vi.tcp(proxy_port), drop)
    proxy.start()
    stack.callback(proxy.stop)
    collector = vi.start_collector(stack, vi.tcp(proxy_port), vi.tcp(replay_port))

    checkpoints = 0
    for step in range(300):
        source.step()
        last = source.last_seq
        # A dropped batch is noticed only when a later one arrives.
        if step % 3 == 2 and last is not None and not drop(last):
            vi.assert_exact(collector, vi.RANK0, source)
            checkpoints += 1
    while source.last_seq is None or drop(source.last_seq):
        source.step()
    vi.assert_exact(collector, vi.RANK0, source)

    assert checkpoints >= 50
    assert len(proxy.dropped) >= 10 and 40 in proxy.dropped and 44 in proxy.dropped
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        counters = ingest.counters
        assert counters.gaps > 0, counters
        assert counters.replays_ok > counters.gaps, counters  # the first replay, then one each
        assert counters.replays_failed == 0 and counters.missing_batches == 0, counters
        assert ingest.degraded is None and not ingest.degraded_history, ingest.degraded_history
        assert counters.batches_applied == source.batches


def test_unrecoverable_gap_degrades_until_reset(stack: ExitStack) -> None:
    """A gap longer than the replay buffer: degraded, said so; a reset makes the map known."""
    port, replay_port, proxy_port = free_port(), free_port(), free_port()
    source = vi.start_source(stack, port, replay_port, seed=5, buffer_steps=5)
    lost = range(30, 42)  # 12 batches in a row, more than the 5 the publisher keeps

    proxy = LossyForwarder(vi.tcp(port), vi.tcp(proxy_port), lambda seq: seq in lost)
    proxy.start()
    stack.callback(proxy.stop)
    recorder = vi.ClearRecorder()
    collector = vi.start_collector(stack, vi.tcp(proxy_port), vi.tcp(replay_port), sink=recorder)

    # Exact up to the loss.
    while source.batches < lost.start:
        source.step()
        vi.assert_exact(collector, vi.RANK0, source)
    # The loss, then enough batches to be noticed.
    while source.batches < lost.stop + 3:
        source.step()
    vi.wait_synced(collector, vi.RANK0, source)
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        degraded = ingest.degraded
        assert degraded is not None, vi.describe(collector, vi.RANK0)
        assert degraded.from_seq == lost.start, degraded
        assert ingest.counters.gaps >= 1 and ingest.counters.missing_batches > 0
        assert ingest.counters.replays_requested >= 2  # it did try
        got = ingest.map.counts()
    assert got != source.truth_counts(), "the loss should have cost the map something"
    # Still degraded while the engine keeps going.
    source.run(10)
    vi.wait_synced(collector, vi.RANK0, source)
    with collector.lock:
        assert collector.ingests[vi.RANK0].degraded is degraded

    # A reset (every running request preempted, then AllBlocksCleared) makes the map known.
    source.reset_preempt()
    clear_seq = source.replica.resets[-1].cleared_in_seq
    vi.wait_synced(collector, vi.RANK0, source)
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        assert ingest.degraded is None, vi.describe(collector, vi.RANK0)
        assert ingest.degraded_history == [degraded]
        assert degraded.cleared_at_seq == clear_seq
        assert recorder.cleared[-1].degraded  # the "before" was known to be incomplete
    for step in range(150):
        source.step()
        if step % 3 == 0:
            vi.assert_exact(collector, vi.RANK0, source)
    vi.assert_exact(collector, vi.RANK0, source)
    with collector.lock:
        assert collector.ingests[vi.RANK0].degraded is None


def test_first_batch_lost_in_transit_is_replayed(stack: ExitStack) -> None:
    """Seq 0 lost after the connect-time replay (which found nothing yet): replay it later."""
    port, replay_port, proxy_port = free_port(), free_port(), free_port()
    source = vi.start_source(stack, port, replay_port, seed=3, resets=vi.RESETS)
    proxy = LossyForwarder(vi.tcp(port), vi.tcp(proxy_port), lambda seq: seq == 0)
    proxy.start()
    stack.callback(proxy.stop)
    collector = vi.start_collector(stack, vi.tcp(proxy_port), vi.tcp(replay_port))
    while source.batches < 2:
        source.step()
    for step in range(60):
        source.step()
        if step % 3 == 0:
            vi.assert_exact(collector, vi.RANK0, source)
    assert proxy.dropped == [0]
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        assert ingest.degraded is None and not ingest.degraded_history, vi.describe(
            collector, vi.RANK0
        )
        assert ingest.counters.replays_ok >= 2
