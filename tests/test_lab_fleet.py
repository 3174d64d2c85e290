"""A fleet in bind mode: lab replicas whose vLLM publishers connect to one bound collector.

Each replica runs vLLM's own Scheduler and ZmqEventPublisher on CPU with a concrete endpoint
(so vLLM connects) and an llm-d topic, `kv@127.0.0.1:<replay port>@lab`; the collector finds
each replay socket through the template `tcp://{ip}:{port}`. Every map is held hash for hash
to its replica's BlockPool while replicas join, one loses batches, one leaves and comes back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import zmq

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import Refusal
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port, free_port_run
from kvscope.lab.replica import LabReplica
from kvscope.lab.settings import EngineSettings
from kvscope.lab.workload import WorkloadSpec
from tests.lab_support import assert_exact
from tests.vllm_integration_support import wait_for
from tests.vllm_source import LossyForwarder

pytestmark = pytest.mark.vllm

GONE_AFTER_S = 2.0


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as exit_stack:
        yield exit_stack


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def last(replica: LabReplica) -> int:
    seq = replica.last_seq
    assert seq is not None, "the replica has published"
    return seq


def fleet_replica(
    stack: ExitStack, name: str, seed: int, publish_to: str, replay_port: int | None = None
) -> tuple[LabReplica, StreamId]:
    """A lab replica publishing to `publish_to` under its llm-d topic, and its stream's id."""
    replay = replay_port or free_port()
    topic = f"kv@127.0.0.1:{replay}@lab"
    replica = LabReplica(
        name,
        WorkloadSpec(rate=4.0, seed=seed),
        EngineSettings(topic=topic),
        replay_port=replay,
        http_port=None,
        publish_to=publish_to,
    )
    stack.callback(replica.close)
    return replica, StreamId(f"127.0.0.1:{replay}", 0)


def registered(collector: Collector, stream: StreamId) -> None:
    wait_for(collector, lambda: stream in collector.ingests, lambda: f"{stream} registered")


def test_replicas_that_connect_join_lose_batches_leave_and_return(stack: ExitStack) -> None:
    bind = free_port()
    collector = Collector(
        [],
        settings=CollectorSettings(replay_timeout_s=2.0),
        fleet=FleetSettings(
            tcp(bind), replay_template="tcp://{ip}:{port}", gone_after_s=GONE_AFTER_S
        ),
    )
    collector.start()
    stack.callback(collector.stop)

    # Replica b's batches pass a forwarder that drops some: its gaps come back by replay.
    def drop(seq: int) -> bool:
        return seq % 11 == 5

    proxy_port = free_port()
    proxy = LossyForwarder(tcp(proxy_port), tcp(bind), drop, connect_mode=True)
    proxy.start()
    stack.callback(proxy.stop)
    a, sa = fleet_replica(stack, "a", 21, tcp(bind))
    b, sb = fleet_replica(stack, "b", 22, tcp(proxy_port))
    fleet = {sa: a, sb: b}
    for _ in range(3):
        for replica in fleet.values():
            replica.run_for(2.0)
        for stream, replica in fleet.items():
            registered(collector, stream)
            if not drop(last(replica)):  # a dropped batch shows only when a later one comes
                assert_exact(collector, stream, replica)

    # A third joins later.
    c, sc = fleet_replica(stack, "c", 23, tcp(bind))
    fleet[sc] = c
    for _ in range(3):
        for replica in fleet.values():
            replica.run_for(2.0)
            while drop(last(replica)) and replica is b:
                replica.run_for(0.5)
        for stream, replica in fleet.items():
            registered(collector, stream)
            assert_exact(collector, stream, replica)
    with collector.lock:
        gaps = collector.ingests[sb].counters
        assert len(proxy.dropped) >= 3 and gaps.gaps >= 3 and gaps.missing_batches == 0, gaps
        assert collector.ingests[sa].counters.gaps == 0
        assert all(collector.is_connected(s) and not collector.is_gone(s) for s in fleet)
        assert set(collector.ingests) == set(fleet)

    # c leaves: gone after the silence, its map kept; the others go on.
    replay_c = c.replay_port
    c.close()
    c_seq, c_counts = last(c), c.truth_counts()
    a.run_for(2.0)
    wait_for(collector, lambda: collector.is_gone(sc), lambda: f"{sc} gone")
    time.sleep(0.2)
    with collector.lock:
        assert not collector.is_connected(sc)
        assert collector.ingests[sc].last_seq == c_seq
        assert collector.ingests[sc].map.counts() == c_counts
    assert_exact(collector, sa, a)

    # A new c on the same address: revived, and seen as a restart (its seq went back).
    c2, sc2 = fleet_replica(stack, "c2", 24, tcp(bind), replay_port=replay_c)
    assert sc2 == sc
    c2.run_for(3.0)
    assert last(c2) < c_seq  # a restart shows as a seq that went back
    wait_for(collector, lambda: not collector.is_gone(sc), lambda: f"{sc} heard again")
    assert_exact(collector, sc, c2)
    with collector.lock:
        assert collector.is_connected(sc)
        assert collector.ingests[sc].counters.restarts == 1
        assert collector.ingests[sc].epoch == 1


def test_topics_the_pattern_does_not_read_are_counted(stack: ExitStack) -> None:
    bind = free_port()
    collector = Collector([], fleet=FleetSettings(tcp(bind)))
    collector.start()
    stack.callback(collector.stop)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stack.callback(ctx.term)
    pub = ctx.socket(zmq.PUB)
    stack.callback(pub.close, 0)
    pub.connect(tcp(bind))
    router = collector.fleet
    assert router is not None
    deadline = time.monotonic() + 10
    while router.router.refused[Refusal.UNMATCHED] < 3 and time.monotonic() < deadline:
        pub.send_multipart([b"kv-events", (0).to_bytes(8, "big"), b"\x93\xcb" + bytes(8)])
        time.sleep(0.01)  # the first ones go before the subscription arrives (slow joiner)
    with collector.lock:
        assert router.router.refused[Refusal.UNMATCHED] >= 3
        assert collector.ingests == {} and collector.up


def test_the_dp_ranks_of_one_pod_are_streams_of_their_own(stack: ExitStack) -> None:
    """vLLM's rank r connects to the bound port + r, under the pod's one topic; the rank is
    read from each batch, and the replay endpoint is the template's + r."""
    bind, replay = free_port_run(2), free_port_run(2)
    collector = Collector(
        [],
        settings=CollectorSettings(replay_timeout_s=2.0),
        fleet=FleetSettings(tcp(bind), replay_template="tcp://{ip}:{port}", dp_ranks=2),
    )
    collector.start()
    stack.callback(collector.stop)
    topic = f"kv@127.0.0.1:{replay}@lab"
    ranks = {}
    for rank in (0, 1):
        replica = LabReplica(
            f"dp{rank}",
            WorkloadSpec(rate=4.0, seed=40 + rank),
            EngineSettings(topic=topic),
            rank=rank,
            replay_port=replay,
            http_port=None,
            publish_to=tcp(bind),
        )
        stack.callback(replica.close)
        ranks[StreamId(f"127.0.0.1:{replay}", rank)] = replica
    for replica in ranks.values():
        replica.run_for(3.0)
    for stream, replica in ranks.items():
        registered(collector, stream)
        assert_exact(collector, stream, replica)
    with collector.lock:
        assert set(collector.ingests) == set(ranks)
        assert all(i.counters.rank_mismatches == 0 for i in collector.ingests.values())
        assert all(i.engine == "vllm" for i in collector.ingests.values())
