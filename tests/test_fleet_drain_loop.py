"""The fleet's drain loop (collector/_fleet_drain.pyx): each message read, routed and handed to
its stream's ingest; a new publisher registered, one gone heard again, a replay asked for sent,
and the socket's end told."""

from __future__ import annotations

from typing import Any

import pytest

from kvscope.collector._fleet_drain import DrainLoop
from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import FleetRouter, Route
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.replay import ReplayRequest
from kvscope.collector.stream_table import StreamTable
from kvscope.collector.types import StreamId, TableKey
from tests.fleet_support import message

pytestmark = pytest.mark.vllm

TOPICS = [b"kv@10.0.0.5:8000@m", b"kv@10.0.0.6:8000@m"]


def sent_at(topic: bytes, seq: int) -> list[bytes]:
    """A message whose blocks are its seq's own."""
    return message(topic, seq, hashes=(seq * 2 + 1, seq * 2 + 2))


class Followed:
    def __init__(self, stream: StreamId, can_replay: bool) -> None:
        self.ingest = StreamIngest(stream, can_replay=can_replay)
        self.sent: list[ReplayRequest] = []

    def send_replay(self, request: ReplayRequest) -> None:
        self.sent.append(request)


class Drain:
    def __init__(self, streams: StreamTable[Any], gone: set[StreamId]) -> None:
        self.streams, self.gone = streams, gone
        self.registered: list[StreamId] = []
        self.heard: list[StreamId] = []

    def _register(self, to: Route, now: float) -> Followed:
        self.registered.append(to.stream)
        stream = Followed(to.stream, can_replay=to.stream.replica[-6] == "6")
        self.streams.put(to.stream, stream)
        return stream

    def _heard_again(self, stream_id: StreamId, stream: Followed) -> None:
        self.gone.discard(stream_id)
        self.heard.append(stream_id)


def test_the_loop_routes_applies_registers_and_sends_what_the_ingest_asks() -> None:
    sent = [sent_at(TOPICS[0], 0), sent_at(TOPICS[1], 0), sent_at(TOPICS[0], 1)]
    sent += [sent_at(TOPICS[1], 3), [b"unrouted"], sent_at(TOPICS[0], 2)]
    queue = list(sent)
    table: StreamTable[Any] = StreamTable()
    streams = table.by_id
    gone: set[StreamId] = set()
    drain = Drain(table, gone)
    router = FleetRouter(FleetSettings("tcp://127.0.0.1:5557"))

    def read() -> list[bytes] | None:
        return queue.pop(0) if queue else None

    loop = DrainLoop(read, router.route_batch, lambda: 5.0, table, gone, drain)
    assert loop.run(3) is False  # three read, more left
    a, b = (StreamId(t.split(b"@")[1].decode(), 0) for t in TOPICS)
    assert drain.registered == [a, b]
    gone.add(a)
    assert loop.run(10) is True  # the rest, then the socket's end
    assert drain.heard == [a] and not gone
    assert [s.ingest.counters.batches_applied for s in (streams[a], streams[b])] == [3, 1]
    assert streams[a].ingest.map.counters.stored_blocks == 6
    # b's seq 3 after 0: a gap, which its replay socket is asked for
    assert [r.start_seq for r in streams[b].sent] == [1]
    assert streams[a].sent == []
    assert router.refused
    assert loop() is False  # one message a call: none left


def test_stream_ids_and_table_keys_keep_their_hashes() -> None:
    # The drain looks each message's stream up by its `StreamId` (and the store's sink each
    # batch's state), the apply each batch's table by its `TableKey` (interned, and the fleet's
    # streams take turns): a hash kept with the object is not computed field by field each time.
    assert StreamId.__struct_config__.cache_hash
    assert TableKey.__struct_config__.cache_hash
    stream, key = StreamId("r", 1), TableKey("GPU", 0)
    assert hash(stream) == hash(StreamId("r", 1)) and stream == StreamId("r", 1)
    assert hash(key) == hash(TableKey("GPU", 0)) and key == TableKey("GPU", 0)
