"""A fleet's publisher (bind mode) under leases: refused while another collector holds its lease,
then followed and stored exactly once the lease is free; released once it is gone.

A lab replica (vLLM's own Scheduler and ZmqEventPublisher on CPU) connects to the collector's
bound socket; the other collector is a lease member made by the test (its heartbeat and lease
rows), since only the lease rows matter to this one.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import pytest

from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import Refusal
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port
from kvscope.pipeline import StoreStarter
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.lease_keeper import LeaseKeeper
from kvscope.storage.leases import Fence, acquire, heartbeat, leases, release
from kvscope.storage.writer import StoreWriter
from tests.lab_support import assert_exact
from tests.test_lab_fleet import fleet_replica, last, tcp
from tests.vllm_integration_support import wait_for

pytestmark = pytest.mark.vllm


def test_a_publisher_leased_elsewhere_waits_then_resumes_exactly(
    pg_url: str, stack: ExitStack
) -> None:
    engine = open_store(pg_url)
    stack.callback(engine.dispose)
    bind, replay = free_port(), free_port()
    stream = StreamId(f"127.0.0.1:{replay}", 0)
    with engine.begin() as conn:
        heartbeat(conn, "other", 600)
        heartbeat(conn, "me", 600)
        grant = acquire(conn, stream, "other")
    assert grant is not None
    fence = Fence("me")
    writer = StoreWriter(engine, fence=fence)
    stack.callback(writer.close)
    collector = Collector(
        [],
        settings=CollectorSettings(replay_timeout_s=2.0),
        sink=writer,
        fleet=FleetSettings(tcp(bind), replay_template="tcp://{ip}:{port}", gone_after_s=2.0),
        starter=StoreStarter(writer, fence),
    )
    collector.start()
    stack.callback(collector.stop)
    assert collector.fleet is not None
    refused = collector.fleet.router.refused
    replica, named = fleet_replica(stack, "a", 51, tcp(bind), replay_port=replay)
    assert named == stream

    replica.run_for(2.0)
    wait_for(collector, lambda: refused[Refusal.LEASED] > 0, lambda: "a refusal")
    with collector.lock:
        assert stream not in collector.ingests and stream not in fence.held()

    with engine.begin() as conn:
        release(conn, stream, "other", grant.token)
    # Asked again every few seconds (wall clock): the replica goes on until then.
    deadline = time.monotonic() + 60
    while stream not in collector.ingests:
        assert time.monotonic() < deadline, "the stream registered once its lease was free"
        replica.run_for(0.5)
        time.sleep(0.2)
    replica.run_for(2.0)
    assert_exact(collector, stream, replica)
    assert fence.held() == {stream: grant.token + 1}
    assert writer.flush()
    with engine.connect() as conn:
        sid = stream_id(conn, stream.replica, stream.rank)
        rebuilt = rebuild(conn, position_at_seq(conn, sid, last(replica)), stream)
    assert rebuilt.map.counts() == replica.truth_counts()
    assert fence.refused_rows == 0

    # Gone (silent past gone_after_s): its lease is released at the keeper's next turn, for
    # whichever collector it speaks to next.
    keeper = LeaseKeeper(engine, [], collector, writer, fence, lambda s: None)
    replica.close()
    wait_for(collector, lambda: collector.is_gone(stream), lambda: f"{stream} gone")
    keeper.tick()
    with engine.connect() as conn:
        assert leases(conn)[stream].owner is None
    assert stream not in collector.ingests and fence.held() == {}
