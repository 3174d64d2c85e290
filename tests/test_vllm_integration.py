"""The collector against vLLM itself: its map must equal vLLM's BlockPool, hash for hash.

Every test runs vLLM's real Scheduler, KVCacheManager and ZmqEventPublisher (a lab replica, see
`vllm_source.py`) and the real `Collector` over TCP loopback, drives a seeded load, and at many
checkpoints waits until the collector has applied every published batch, then compares its map
with the pool's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from vllm.distributed.kv_events import KVEventBatch

from kvscope.collector.block_table import TableStats
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.sink import ClearedMap, ClearReason, EventSink, NullSink
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port, free_port_run
from tests.vllm_source import LossyForwarder, ResetOdds, Source, diff_counts, reference_stats

pytestmark = pytest.mark.vllm

REPLICA = "r1"
RANK0 = StreamId(REPLICA, 0)
RANK1 = StreamId(REPLICA, 1)
SYNC_TIMEOUT_S = 10.0
SETTINGS = CollectorSettings(replay_timeout_s=2.0)
RESETS = ResetOdds(default=0.03, preempt=0.02, keep=0.04, idle=0.015)
"""Resets in every way vLLM can (and the proposed keep-running way)."""
DP0_RESETS = ResetOdds(preempt=0.03, keep=0.05, idle=0.02)


class ClearRecorder(NullSink):
    """A sink that keeps every `ClearedMap` it is handed."""

    def __init__(self) -> None:
        self.cleared: list[ClearedMap] = []

    def map_cleared(self, cleared: ClearedMap) -> None:
        self.cleared.append(cleared)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Publishers, forwarders and collectors registered here are shut down after the test."""
    with ExitStack() as exit_stack:
        yield exit_stack


# --- helpers ------------------------------------------------------------------------------------
def wait_for(collector: Collector, condition: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        with collector.lock:
            if condition():
                return
        if time.monotonic() > deadline:
            with collector.lock:
                raise AssertionError(f"timed out after {SYNC_TIMEOUT_S} s waiting for {what()}")
        time.sleep(0.002)


def describe(collector: Collector, stream: StreamId) -> str:
    ingest = collector.ingests[stream]
    return (
        f"{stream}: last_seq={ingest.last_seq} epoch={ingest.epoch} "
        f"replaying={ingest.replaying} degraded={ingest.degraded} counters={ingest.counters}"
    )


def start_collector(
    stack: ExitStack,
    endpoint: str,
    replay_endpoint: str | None,
    dp_ranks: int = 1,
    sink: EventSink | None = None,
) -> Collector:
    """A running collector whose streams are connected and past their first replay."""
    streams = replica_streams(
        REPLICA, endpoint, replay_endpoint=replay_endpoint, dp_ranks=dp_ranks, topic=""
    )
    collector = Collector(streams, settings=SETTINGS, sink=sink)
    collector.start()
    stack.callback(collector.stop)
    for spec in streams:
        stream = spec.stream
        ingest = collector.ingests[stream]

        def ready(stream: StreamId = stream) -> bool:
            ingest = collector.ingests[stream]
            counters = ingest.counters
            return (
                collector.is_connected(stream)
                and counters.replays_ok + counters.replays_failed >= 1
                and not ingest.replaying
            )

        def state(stream: StreamId = stream) -> str:
            return "ready: " + describe(collector, stream)

        wait_for(collector, ready, state)
        assert ingest.counters.replays_ok == 1, describe(collector, stream)
    return collector


def wait_synced(
    collector: Collector, stream: StreamId, source: Source, epoch: int | None = None
) -> None:
    """Until the collector has applied the last batch `source` published and no replay runs."""
    last_seq = source.last_seq

    def synced() -> bool:
        ingest = collector.ingests[stream]
        return (
            ingest.last_seq == last_seq
            and not ingest.replaying
            and (epoch is None or ingest.epoch == epoch)
        )

    wait_for(
        collector,
        synced,
        lambda: f"seq {last_seq} (epoch {epoch}): " + describe(collector, stream),
    )


def assert_exact(collector: Collector, stream: StreamId, source: Source) -> TableStats:
    """The collector's map is vLLM's map, and its totals match a reference from the chains."""
    wait_synced(collector, stream, source)
    with collector.lock:
        ingest = collector.ingests[stream]
        got = ingest.map.counts()
        totals = ingest.map.totals()
        state = describe(collector, stream)
    want = source.truth_counts()
    assert got == want, f"{diff_counts(got, want)} [{state}]"
    ref = reference_stats(want, source.parents)
    assert totals == TableStats(ref.blocks, ref.copies, ref.hittable, ref.orphans), state
    return totals


def start_source(
    stack: ExitStack,
    port: int,
    replay_port: int | None,
    seed: int,
    resets: ResetOdds | None = None,
    rank: int = 0,
    num_blocks: int = 64,
    buffer_steps: int = 10_000,
    name: str = "req",
) -> Source:
    source = Source.start(num_blocks, port, replay_port, rank, buffer_steps, seed, resets, name)
    stack.callback(source.close)
    return source


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


# --- the tests ----------------------------------------------------------------------------------
def test_random_workload_with_resets_and_eviction(stack: ExitStack) -> None:
    """Shared prefixes, eviction, duplicates, and all three resets: exact at every checkpoint."""
    port, replay_port = free_port(), free_port()
    source = start_source(stack, port, replay_port, seed=1234, resets=RESETS)
    recorder = ClearRecorder()
    collector = start_collector(stack, tcp(port), tcp(replay_port), sink=recorder)

    checkpoints = orphan_checkpoints = duplicate_checkpoints = 0
    max_orphans = 0
    for step in range(480):
        source.step()
        if step % 4 == 3:
            totals = assert_exact(collector, RANK0, source)
            checkpoints += 1
            max_orphans = max(max_orphans, totals.orphans)
            orphan_checkpoints += totals.orphans > 0
            duplicate_checkpoints += totals.copies > totals.blocks
    totals = assert_exact(collector, RANK0, source)

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
        ingest = collector.ingests[RANK0]
        counters = ingest.counters
        assert ingest.degraded is None and not ingest.degraded_history
        assert counters.gaps == 0 and counters.restarts == 0 and not counters.malformed
        assert counters.batches_applied == source.batches
        assert ingest.map.counters.clears == source.events["AllBlocksCleared"]
        assert len(recorder.cleared) == source.events["AllBlocksCleared"]
        assert all(c.reason is ClearReason.ALL_BLOCKS_CLEARED for c in recorder.cleared)
        assert all(c.stream == RANK0 and c.epoch == 0 for c in recorder.cleared)
    assert checkpoints >= 100


def test_lost_batches_are_replayed(stack: ExitStack) -> None:
    """Batches dropped between publisher and collector come back by replay: exact, not degraded."""
    port, replay_port, proxy_port = free_port(), free_port(), free_port()
    source = start_source(stack, port, replay_port, seed=99, resets=RESETS)

    def drop(seq: int) -> bool:
        return seq % 13 == 6 or 40 <= seq <= 44

    proxy = LossyForwarder(tcp(port), tcp(proxy_port), drop)
    proxy.start()
    stack.callback(proxy.stop)
    collector = start_collector(stack, tcp(proxy_port), tcp(replay_port))

    checkpoints = 0
    for step in range(300):
        source.step()
        last = source.last_seq
        # A dropped batch is noticed only when a later one arrives.
        if step % 3 == 2 and last is not None and not drop(last):
            assert_exact(collector, RANK0, source)
            checkpoints += 1
    while source.last_seq is None or drop(source.last_seq):
        source.step()
    assert_exact(collector, RANK0, source)

    assert checkpoints >= 50
    assert len(proxy.dropped) >= 10 and 40 in proxy.dropped and 44 in proxy.dropped
    with collector.lock:
        ingest = collector.ingests[RANK0]
        counters = ingest.counters
        assert counters.gaps > 0, counters
        assert counters.replays_ok > counters.gaps, counters  # the first replay, then one each
        assert counters.replays_failed == 0 and counters.missing_batches == 0, counters
        assert ingest.degraded is None and not ingest.degraded_history, ingest.degraded_history
        assert counters.batches_applied == source.batches


def test_unrecoverable_gap_degrades_until_reset(stack: ExitStack) -> None:
    """A gap longer than the replay buffer: degraded, said so; a reset makes the map known."""
    port, replay_port, proxy_port = free_port(), free_port(), free_port()
    source = start_source(stack, port, replay_port, seed=5, buffer_steps=5)
    lost = range(30, 42)  # 12 batches in a row, more than the 5 the publisher keeps

    proxy = LossyForwarder(tcp(port), tcp(proxy_port), lambda seq: seq in lost)
    proxy.start()
    stack.callback(proxy.stop)
    recorder = ClearRecorder()
    collector = start_collector(stack, tcp(proxy_port), tcp(replay_port), sink=recorder)

    # Exact up to the loss.
    while source.batches < lost.start:
        source.step()
        assert_exact(collector, RANK0, source)
    # The loss, then enough batches to be noticed.
    while source.batches < lost.stop + 3:
        source.step()
    wait_synced(collector, RANK0, source)
    with collector.lock:
        ingest = collector.ingests[RANK0]
        degraded = ingest.degraded
        assert degraded is not None, describe(collector, RANK0)
        assert degraded.from_seq == lost.start, degraded
        assert ingest.counters.gaps >= 1 and ingest.counters.missing_batches > 0
        assert ingest.counters.replays_requested >= 2  # it did try
        got = ingest.map.counts()
    assert got != source.truth_counts(), "the loss should have cost the map something"
    # Still degraded while the engine keeps going.
    source.run(10)
    wait_synced(collector, RANK0, source)
    with collector.lock:
        assert collector.ingests[RANK0].degraded is degraded

    # A reset (every running request preempted, then AllBlocksCleared) makes the map known.
    source.reset_preempt()
    clear_seq = source.replica.resets[-1].cleared_in_seq
    wait_synced(collector, RANK0, source)
    with collector.lock:
        ingest = collector.ingests[RANK0]
        assert ingest.degraded is None, describe(collector, RANK0)
        assert ingest.degraded_history == [degraded]
        assert degraded.cleared_at_seq == clear_seq
        assert recorder.cleared[-1].degraded  # the "before" was known to be incomplete
    for step in range(150):
        source.step()
        if step % 3 == 0:
            assert_exact(collector, RANK0, source)
    assert_exact(collector, RANK0, source)
    with collector.lock:
        assert collector.ingests[RANK0].degraded is None


@pytest.mark.parametrize("racing", [False, True], ids=["after-reconnect", "racing-reconnect"])
def test_publisher_restart_starts_a_new_epoch(stack: ExitStack, racing: bool) -> None:
    """A new engine on the same ports: seq starts over, the old map is handed over and emptied.

    after-reconnect: the new engine publishes once the collector has reconnected and finished
    the replay it asks for on reconnect. racing-reconnect: it publishes at once (its first
    batches are lost to the slow joiner) and goes on while that replay is still in flight; the
    replay buffer still has everything, so the map must come out exact all the same.
    """
    port, replay_port = free_port(), free_port()
    first = Source.start(64, port, replay_port, seed=7, name="old")
    stack.callback(first.close)
    recorder = ClearRecorder()
    collector = start_collector(stack, tcp(port), tcp(replay_port), sink=recorder)
    steps = 0
    while first.batches < 150:
        first.step()
        steps += 1
        if steps % 5 == 0:
            assert_exact(collector, RANK0, first)
    assert_exact(collector, RANK0, first)
    old_batches = first.batches
    with collector.lock:
        old_map = collector.ingests[RANK0].map.counts()
    assert old_map

    # The engine dies and a new one (empty cache, seq from 0) binds the same ports.
    first.close()
    second = start_source(stack, port, replay_port, seed=8, name="new")
    if racing:
        # A busy engine: a batch every few ms from its start, through the collector's reconnect
        # (its first batches are lost to the slow joiner) and the replay asked on reconnect.
        reconnected_at: int | None = None
        while reconnected_at is None or second.batches < reconnected_at + 15:
            second.step()
            time.sleep(0.003)
            if reconnected_at is None and collector.connection_counts(RANK0)[0] >= 2:
                reconnected_at = second.batches
            assert second.batches < old_batches, "the collector took too long to reconnect"
    else:

        def reconnected() -> bool:
            ingest = collector.ingests[RANK0]
            connects = collector.connection_counts(RANK0)[0]
            return connects >= 2 and ingest.counters.replays_ok >= 2 and not ingest.replaying

        wait_for(collector, reconnected, lambda: "a reconnect: " + describe(collector, RANK0))
    for step in range(100):
        second.step()
        if step % 5 == 4:
            wait_synced(collector, RANK0, second, epoch=1)
            assert_exact(collector, RANK0, second)
    wait_synced(collector, RANK0, second, epoch=1)
    assert_exact(collector, RANK0, second)

    with collector.lock:
        ingest = collector.ingests[RANK0]
        assert ingest.counters.restarts == 1, describe(collector, RANK0)
        assert ingest.epoch == 1
        assert ingest.degraded is None
        restarts = [c for c in recorder.cleared if c.reason is ClearReason.RESTART]
        assert len(restarts) == 1, recorder.cleared
        (restart,) = restarts
        assert restart.stream == RANK0 and restart.epoch == 0 and not restart.degraded
        before = {
            (h, key.group): n
            for key, table in restart.tables.items()
            if key.medium == "GPU"
            for h, n in table.counts().items()
        }
        assert before == old_map  # the listener saw the old engine's whole map


def test_restart_while_disconnected_is_noticed(stack: ExitStack) -> None:
    """A new engine that got past the old engine's seq before the collector reconnected.

    Its first batches are lost to the slow joiner, and on reconnect the collector asks for a
    replay from the old epoch's next seq, which the new publisher has: the seq never goes back.
    The restart must still be noticed (the overlap's payloads differ), never silently merged.
    """
    port, replay_port = free_port(), free_port()
    first = Source.start(64, port, replay_port, seed=17, name="old")
    stack.callback(first.close)
    collector = start_collector(stack, tcp(port), tcp(replay_port))
    while first.batches < 10:
        first.step()
    assert_exact(collector, RANK0, first)

    first.close()
    second = start_source(stack, port, replay_port, seed=18, name="new")
    while second.batches < 25:  # a few ms: well before the collector's reconnect (100 ms)
        second.step()
    wait_for(
        collector,
        lambda: collector.connection_counts(RANK0)[0] >= 2,
        lambda: "a reconnect: " + describe(collector, RANK0),
    )
    second.run(20)
    wait_synced(collector, RANK0, second)
    with collector.lock:
        ingest = collector.ingests[RANK0]
        assert ingest.counters.restarts == 1 and ingest.epoch == 1, describe(collector, RANK0)
    assert_exact(collector, RANK0, second)


def test_first_batch_lost_in_transit_is_replayed(stack: ExitStack) -> None:
    """Seq 0 lost after the connect-time replay (which found nothing yet): replay it later."""
    port, replay_port, proxy_port = free_port(), free_port(), free_port()
    source = start_source(stack, port, replay_port, seed=3, resets=RESETS)
    proxy = LossyForwarder(tcp(port), tcp(proxy_port), lambda seq: seq == 0)
    proxy.start()
    stack.callback(proxy.stop)
    collector = start_collector(stack, tcp(proxy_port), tcp(replay_port))
    while source.batches < 2:
        source.step()
    for step in range(60):
        source.step()
        if step % 3 == 0:
            assert_exact(collector, RANK0, source)
    assert proxy.dropped == [0]
    with collector.lock:
        ingest = collector.ingests[RANK0]
        assert ingest.degraded is None and not ingest.degraded_history, describe(collector, RANK0)
        assert ingest.counters.replays_ok >= 2


def test_two_dp_ranks_are_separate_streams(stack: ExitStack) -> None:
    """Two ranks on base port + rank: only rank 0 resets; rank 1's map is untouched by it."""
    port = free_port_run(2)
    replay_port = free_port_run(2, exclude=(port, port + 1))
    rank0 = start_source(stack, port, replay_port, seed=10, resets=DP0_RESETS, rank=0, name="dp0")
    rank1 = start_source(stack, port, replay_port, seed=11, rank=1, num_blocks=48, name="dp1")
    recorder = ClearRecorder()
    collector = start_collector(stack, tcp(port), tcp(replay_port), dp_ranks=2, sink=recorder)

    for step in range(240):
        rank0.step()
        rank1.step()
        if step % 4 == 3:
            assert_exact(collector, RANK0, rank0)
            assert_exact(collector, RANK1, rank1)
    assert_exact(collector, RANK0, rank0)
    assert_exact(collector, RANK1, rank1)

    assert rank0.events["AllBlocksCleared"] >= 3 and rank1.events["AllBlocksCleared"] == 0
    with collector.lock:
        ingest0, ingest1 = collector.ingests[RANK0], collector.ingests[RANK1]
        assert ingest0.map.counters.clears == rank0.events["AllBlocksCleared"]
        assert ingest1.map.counters.clears == 0
        assert {c.stream for c in recorder.cleared} == {RANK0}
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
    source = start_source(stack, port, replay_port, seed=21, resets=RESETS)
    hash_types: set[type] = set()

    def look(seq: int, batch: KVEventBatch) -> None:
        for event in batch.events:
            hash_types.update(type(h) for h in getattr(event, "block_hashes", ()))

    source.replica.batch_observers.append(look)
    collector = start_collector(stack, tcp(port), tcp(replay_port))
    for step in range(240):
        source.step()
        if step % 4 == 3:
            assert_exact(collector, RANK0, source)
    assert_exact(collector, RANK0, source)

    assert hash_types == {bytes}
    with collector.lock:
        ingest = collector.ingests[RANK0]
        assert ingest.degraded is None and not ingest.counters.malformed
        (table,) = ingest.map.tables.values()
        raw = {h: table.raw_hash(h) for h in table.counts()}
    assert raw and all(r is not None and len(r) == 32 for r in raw.values())
    assert all(int.from_bytes(r, "big") & (2**64 - 1) == h for h, r in raw.items() if r)
