"""For the vLLM integration tests: start sources and collectors, wait until synced, compare maps."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack

import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from kvscope.collector.block_table import TableStats
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.sink import ClearedMap, EventSink, NullSink
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from tests.vllm_source import ResetOdds, Source, diff_counts, reference_stats

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
