"""Against vLLM itself: a restarted publisher starts a new epoch, noticed even while away."""

from __future__ import annotations

import time
from contextlib import ExitStack

import pytest

from kvscope.collector.sink import ClearReason
from kvscope.lab.ports import free_port
from tests import vllm_integration_support as vi
from tests.vllm_source import Source

pytestmark = pytest.mark.vllm


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
    recorder = vi.ClearRecorder()
    collector = vi.start_collector(stack, vi.tcp(port), vi.tcp(replay_port), sink=recorder)
    steps = 0
    while first.batches < 150:
        first.step()
        steps += 1
        if steps % 5 == 0:
            vi.assert_exact(collector, vi.RANK0, first)
    vi.assert_exact(collector, vi.RANK0, first)
    old_batches = first.batches
    with collector.lock:
        old_map = collector.ingests[vi.RANK0].map.counts()
    assert old_map

    # The engine dies and a new one (empty cache, seq from 0) binds the same ports.
    first.close()
    second = vi.start_source(stack, port, replay_port, seed=8, name="new")
    if racing:
        # A busy engine: a batch every few ms from its start, through the collector's reconnect
        # (its first batches are lost to the slow joiner) and the replay asked on reconnect.
        reconnected_at: int | None = None
        while reconnected_at is None or second.batches < reconnected_at + 15:
            second.step()
            time.sleep(0.003)
            if reconnected_at is None and collector.connection_counts(vi.RANK0)[0] >= 2:
                reconnected_at = second.batches
            assert second.batches < old_batches, "the collector took too long to reconnect"
    else:

        def reconnected() -> bool:
            ingest = collector.ingests[vi.RANK0]
            connects = collector.connection_counts(vi.RANK0)[0]
            return connects >= 2 and ingest.counters.replays_ok >= 2 and not ingest.replaying

        vi.wait_for(
            collector, reconnected, lambda: "a reconnect: " + vi.describe(collector, vi.RANK0)
        )
    for step in range(100):
        second.step()
        if step % 5 == 4:
            vi.wait_synced(collector, vi.RANK0, second, epoch=1)
            vi.assert_exact(collector, vi.RANK0, second)
    vi.wait_synced(collector, vi.RANK0, second, epoch=1)
    vi.assert_exact(collector, vi.RANK0, second)

    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        assert ingest.counters.restarts == 1, vi.describe(collector, vi.RANK0)
        assert ingest.epoch == 1
        assert ingest.degraded is None
        restarts = [c for c in recorder.cleared if c.reason is ClearReason.RESTART]
        assert len(restarts) == 1, recorder.cleared
        (restart,) = restarts
        assert restart.stream == vi.RANK0 and restart.epoch == 0 and not restart.degraded
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
    collector = vi.start_collector(stack, vi.tcp(port), vi.tcp(replay_port))
    while first.batches < 10:
        first.step()
    vi.assert_exact(collector, vi.RANK0, first)

    first.close()
    second = vi.start_source(stack, port, replay_port, seed=18, name="new")
    while second.batches < 25:  # a few ms: well before the collector's reconnect (100 ms)
        second.step()
    vi.wait_for(
        collector,
        lambda: collector.connection_counts(vi.RANK0)[0] >= 2,
        lambda: "a reconnect: " + vi.describe(collector, vi.RANK0),
    )
    second.run(20)
    vi.wait_synced(collector, vi.RANK0, second)
    with collector.lock:
        ingest = collector.ingests[vi.RANK0]
        assert ingest.counters.restarts == 1 and ingest.epoch == 1, vi.describe(collector, vi.RANK0)
    vi.assert_exact(collector, vi.RANK0, second)
