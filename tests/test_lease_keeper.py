"""The lease keeper's moves on the real PostgreSQL, one turn at a time (`tick`, no thread):
it takes its share, gives up what falls to a member that joins, takes back what a dead member
held, and drops a stream whose lease another member took.

The other members are rows the test writes (their heartbeats and leases): only those rows
matter to this keeper. Its streams point at a port nothing listens on; no data is needed.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import NamedTuple

import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.api.metrics import make_registry
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.config import Config, ReplicaConfig, StoreConfig
from kvscope.lab.ports import free_port
from kvscope.pipeline import running_pipeline
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.lease_keeper import LeaseKeeper
from kvscope.storage.leases import (
    Fence,
    LeaseSettings,
    heartbeat,
    leases,
    live_members,
    owner_of,
)
from kvscope.storage.writer import StoreWriter

SHORT_TTL = 0.3
M = schema.lease_members


class Me(NamedTuple):
    engine: sa.Engine
    keeper: LeaseKeeper
    collector: Collector
    writer: StoreWriter
    fence: Fence
    streams: set[StreamId]


def member_me(url: str, replicas: int, stack: ExitStack) -> Me:
    """The keeper of member "me" (no heartbeat yet), its collector running, over `replicas`
    replicas whose sockets point at a port nothing listens on (they just wait)."""
    engine = open_store(url)
    stack.callback(engine.dispose)
    port = free_port()
    specs = [
        s for i in range(replicas) for s in replica_streams(f"r{i}", f"tcp://127.0.0.1:{port}")
    ]
    fence = Fence("me")
    writer = StoreWriter(engine, fence=fence)
    stack.callback(writer.close)
    collector = Collector([], sink=writer)
    collector.start()
    stack.callback(collector.stop)
    keeper = LeaseKeeper(
        engine, specs, collector, writer, fence, lambda s: None, LeaseSettings(ttl_s=600)
    )
    fence.on_refused = keeper.fenced
    return Me(engine, keeper, collector, writer, fence, {s.stream for s in specs})


def test_the_keeper_takes_gives_up_takes_back_and_drops(pg_url: str, stack: ExitStack) -> None:
    engine, keeper, collector, writer, fence, streams = member_me(pg_url, 8, stack)

    def owners() -> dict[StreamId, str | None]:
        with engine.connect() as conn:
            return {s: lease.owner for s, lease in leases(conn).items() if lease.live}

    def beat(member: str, ttl: float) -> None:
        with engine.begin() as conn:
            heartbeat(conn, member, ttl)

    beat("me", 600)
    keeper.tick()
    assert owners() == dict.fromkeys(streams, "me")
    assert set(collector.ingests) == streams == set(fence.held())

    # "b" joins: its share is given up (released), the rest kept.
    beat("b", SHORT_TTL)
    keeper.tick()
    share_b = {s for s in streams if owner_of(s, ["b", "me"]) == "b"}
    assert share_b, "eight streams over two members"
    assert owners() == {s: "me" for s in streams - share_b}
    assert set(collector.ingests) == streams - share_b == set(fence.held())
    assert keeper.stats.released == len(share_b)

    # b never took them and its heartbeat stops: they come back at the next turn.
    deadline = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            if "b" not in live_members(conn):
                break
        assert time.monotonic() < deadline, "b's heartbeat to expire"
        time.sleep(0.05)
    keeper.tick()
    assert owners() == dict.fromkeys(streams, "me")
    assert set(collector.ingests) == streams

    # Another member took one (as if this one had stopped beating): dropped at once.
    taken = min(streams, key=str)
    leased = schema.stream_leases
    with engine.begin() as conn:
        heartbeat(conn, "c", 600)
        conn.execute(
            sa.update(leased)
            .where(leased.c.replica == taken.replica, leased.c.rank == taken.rank)
            .values(owner="c", token=leased.c.token + 1)
        )
    keeper.tick()
    assert taken not in collector.ingests and taken not in fence.held()
    assert keeper.stats.lost == 1
    assert keeper.stats.takeovers == 0 and keeper.stats.acquired == len(streams) + len(share_b)

    # /metrics says so.
    registry, _ = make_registry(ApiData(collector=collector, engine=engine, writer=writer))
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert samples["kvscope_leases_held"] == len(fence.held())
    assert samples["kvscope_leases_lost_total"] == 1
    assert samples["kvscope_leases_takeovers_total"] == 0
    assert samples["kvscope_store_rows_fenced_total"] == fence.refused_rows


def test_readyz_waits_for_the_first_lease_round_and_a_lost_store(
    pg_url: str, stack: ExitStack
) -> None:
    """Ready only once this member knows which streams it holds: after its first round, and
    not while its rounds fail (the store lost); a collector without leases never waits."""
    engine, keeper, collector, writer, fence, streams = member_me(pg_url, 1, stack)
    with engine.begin() as conn:
        heartbeat(conn, "me", 600)

    def ready(leases: LeaseKeeper | None) -> tuple[int, str, str]:
        data = ApiData(collector=collector, engine=engine, writer=writer, leases=leases)
        answer = TestClient(create_app(data)).get("/readyz")
        error = answer.json().get("error", {})
        return answer.status_code, error.get("code", ""), error.get("message", "")

    assert ready(None)[0] == 200  # no leases: nothing to wait for
    status, code, message = ready(keeper)
    assert (status, code) == (503, "leases_settling")
    assert "first lease round" in message

    keeper.turn()
    assert set(fence.held()) == streams
    assert ready(keeper)[0] == 200

    # The store stops answering the keeper: which streams it holds is not known any more.
    keeper.engine = sa.create_engine(f"postgresql+psycopg://127.0.0.1:{free_port()}/none")
    stack.callback(keeper.engine.dispose)
    keeper.turn()
    status, code, message = ready(keeper)
    assert (status, code) == (503, "leases_settling")
    assert "OperationalError" in message and "last lease round failed" in message

    keeper.engine = engine
    keeper.turn()
    assert ready(keeper)[0] == 200


def test_the_pipeline_keeps_leases_with_the_configured_timing(pg_url: str) -> None:
    config = Config(
        replicas=[ReplicaConfig("r", f"tcp://127.0.0.1:{free_port()}")],
        store=StoreConfig(pg_url, lease=True, lease_ttl_s=45.0, lease_renew_s=0.2),
    )
    with running_pipeline(config) as (_, writer, keeper):
        assert keeper is not None and writer is not None
        assert keeper.settings == LeaseSettings(ttl_s=45.0, renew_s=0.2)
        deadline = time.monotonic() + 30
        while keeper.unsettled() is not None:
            assert time.monotonic() < deadline, "the first lease round"
            time.sleep(0.05)
        with writer.engine.connect() as conn:
            left = conn.execute(
                sa.select(
                    sa.func.extract("epoch", M.c.expires_at - sa.func.clock_timestamp())
                ).where(M.c.id == keeper.member)
            ).scalar_one()
        assert 30 < left <= 45  # the heartbeat's TTL is the configured one
