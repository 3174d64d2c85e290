"""The fleet drain's stream of each route, kept on the route between messages and drains
(collector/_fleet_drain.pyx): valid only while the collector's streams (collector/stream_table.py)
are unchanged, so a stream replaced, removed or re-added under a route already cached gets the
route's next message, and a removed one never does."""

from __future__ import annotations

from typing import Any

import pytest

from kvscope.collector._fleet_drain import DrainLoop
from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import FleetRouter, Route
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.replay import ReplayRequest
from kvscope.collector.stream_table import StreamTable
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from tests.fleet_support import message

pytestmark = pytest.mark.vllm

TOPIC = b"kv@10.0.0.5:8000@m"
STREAM = StreamId("10.0.0.5:8000", 0)


class Followed:
    def __init__(self, stream: StreamId) -> None:
        self.ingest = StreamIngest(stream, can_replay=False)
        self.sent: list[ReplayRequest] = []

    def send_replay(self, request: ReplayRequest) -> None:
        self.sent.append(request)

    @property
    def applied(self) -> int:
        return self.ingest.counters.batches_applied


class Drain:
    def __init__(self, table: StreamTable[Followed]) -> None:
        self.table = table

    def _register(self, to: Route, now: float) -> Followed:
        stream = Followed(to.stream)
        self.table.put(to.stream, stream)
        return stream

    def _heard_again(self, stream_id: StreamId, stream: Any) -> None:
        raise AssertionError("no publisher is gone here")


class Fleet:
    """One publisher's messages, each drained by a loop of its own (as `FleetDrain.drain`)."""

    def __init__(self) -> None:
        self.table: StreamTable[Followed] = StreamTable()
        self.router = FleetRouter(FleetSettings("tcp://127.0.0.1:5557"))
        self.drain = Drain(self.table)
        self.seq = 0

    def send(self) -> None:
        queue = [message(TOPIC, self.seq, hashes=(self.seq * 2 + 1, self.seq * 2 + 2))]
        self.seq += 1
        loop = DrainLoop(
            lambda: queue.pop() if queue else None,
            self.router.route_batch,
            lambda: 5.0,
            self.table,
            set(),
            self.drain,
        )
        assert loop.run(2) is True


def test_every_change_of_the_table_bumps_its_version() -> None:
    table: StreamTable[Followed] = StreamTable()
    seen = [table.version]
    a, b = Followed(STREAM), Followed(STREAM)
    table.put(STREAM, a)
    seen.append(table.version)
    table.put(STREAM, b)  # the same name, another stream
    seen.append(table.version)
    assert table.pop(STREAM) is b and table.get(STREAM) is None
    seen.append(table.version)
    assert table.pop(STREAM) is None  # nothing there: nothing changed
    seen.append(table.version)
    table.put(STREAM, a)
    table.clear()
    seen.append(table.version)
    assert len(set(seen)) == len(seen) - 1 and seen[-3] == seen[-2]
    assert list(table.values()) == []


def test_a_stream_replaced_under_a_cached_route_gets_its_next_message() -> None:
    fleet = Fleet()
    fleet.send()  # registers the stream
    fleet.send()  # routed, its stream kept on the route
    first = fleet.table.get(STREAM)
    assert first is not None and first.applied == 2
    again = Followed(STREAM)
    fleet.table.put(STREAM, again)  # as `Collector.add_stream` for the same name
    fleet.send()
    assert first.applied == 2
    assert again.applied == 1


def test_a_removed_stream_is_never_served_and_one_re_added_is() -> None:
    fleet = Fleet()
    fleet.send()
    fleet.send()
    first = fleet.table.pop(STREAM)  # the route stays (the router is not told)
    assert first is not None
    with pytest.raises(KeyError):
        fleet.send()
    assert first.applied == 2
    again = Followed(STREAM)
    fleet.table.put(STREAM, again)
    fleet.send()
    assert first.applied == 2 and again.applied == 1


def test_a_publisher_forgotten_and_heard_again_goes_to_its_new_stream() -> None:
    fleet = Fleet()
    fleet.send()
    fleet.send()
    first = fleet.table.pop(STREAM)
    fleet.router.forget(STREAM)  # as `Collector.remove_stream`
    fleet.send()  # registered afresh
    now = fleet.table.get(STREAM)
    assert now is not None and now is not first
    fleet.send()
    assert first is not None and first.applied == 2
    assert now.applied == 2


def test_the_collectors_streams_change_through_its_table() -> None:
    collector = Collector([], fleet=FleetSettings("tcp://127.0.0.1:5557"))
    assert isinstance(collector._streams, StreamTable)
    spec = StreamEndpoint(STREAM, "tcp://127.0.0.1:5999", False, None)
    before = collector._streams.version
    collector.add_stream(spec, None)
    added = collector._streams.get(STREAM)
    assert added is not None and collector._streams.version != before
    before = collector._streams.version
    collector.add_stream(spec, None)  # the same name again: replaced
    assert collector._streams.get(STREAM) is not added
    assert collector._streams.version != before
    before = collector._streams.version
    collector.remove_stream(STREAM)
    assert collector._streams.get(STREAM) is None and collector._streams.version != before
    added.close()
    collector._ctx.term()
