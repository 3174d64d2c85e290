"""The poll loop rebuilds its poller only when a socket opened or closed: every such change
gives `SocketChanges.latest` a value it never had, and nothing else changes it."""

from __future__ import annotations

import zmq

from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.replay import ReplayRequest
from kvscope.collector.sockets import CollectorSettings, SocketChanges, StreamSockets
from kvscope.collector.types import StreamId


def test_each_socket_opened_or_closed_is_a_change_and_nothing_else_is() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stream = StreamId("r", 0)
    spec = StreamEndpoint(stream, "tcp://127.0.0.1:1", True, "tcp://127.0.0.1:2")
    try:
        seen = [SocketChanges.latest]
        shared = StreamSockets(
            ctx, spec, StreamIngest(stream, can_replay=True), CollectorSettings(), shared=True
        )
        assert SocketChanges.latest == seen[-1]  # a fleet's stream: no socket of its own
        shared.send_replay(ReplayRequest(0))
        seen.append(SocketChanges.latest)
        shared.handshake_done()
        shared.close_dealer()
        seen.append(SocketChanges.latest)
        shared.close_dealer()  # nothing open: no change
        connecting = StreamEndpoint(StreamId("s", 0), "tcp://127.0.0.1:1", False, None)
        own = StreamSockets(
            ctx, connecting, StreamIngest(connecting.stream, can_replay=False), CollectorSettings()
        )
        seen.append(SocketChanges.latest)
        own.close()
        seen.append(SocketChanges.latest)
        assert len(set(seen)) == len(seen)
    finally:
        ctx.term()
