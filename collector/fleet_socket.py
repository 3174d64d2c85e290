"""A fleet's one bound SUB socket, its router and which of its publishers are gone.

The collector (collector/subscriber.py) polls `sub`, routes each message through `router` and
keeps a `StreamSockets` per publisher (shared: only the replay DEALER is the publisher's own).
"""

from __future__ import annotations

from collections.abc import Iterable

import zmq

from kvscope.collector.endpoints import offset_port
from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import FleetRouter
from kvscope.collector.sockets import (
    CollectorSettings,
    MessageReader,
    SocketChanges,
    StreamSockets,
    message_reader,
)
from kvscope.collector.types import StreamId

GATHER_S = 0.01
"""The loop wakes for the fleet at most once per this: once a drain has emptied the fleet's
socket, it waits out the rest of it, and messages gather meanwhile for the next wake-up. Each
wake-up costs the loop's round and libzmq's signalling for the messages it finds, which a busy
fleet otherwise pays every few messages; a batch waits at most this much longer. A loop whose
rounds take longer than this (behind) never waits."""


class FleetSocket:
    def __init__(
        self, settings: FleetSettings, taken: Iterable[StreamId] = (), from_bytes: bool = True
    ) -> None:
        self.settings = settings
        self.router = FleetRouter(settings, taken, from_bytes)
        self.gone: set[StreamId] = set()
        """Publishers silent past `gone_after_s`: kept (map, history), shown as gone."""
        self.sub: zmq.Socket[bytes] | None = None
        self.read: MessageReader | None = None

    @property
    def gone_after_s(self) -> float:
        return self.settings.gone_after_s

    def open(self, ctx: zmq.Context[zmq.Socket[bytes]], settings: CollectorSettings) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: the router tells them apart
        sub.setsockopt(zmq.MAXMSGSIZE, settings.max_message_bytes)
        sub.setsockopt(zmq.RCVHWM, settings.rcvhwm)
        sub.setsockopt(zmq.LINGER, 0)
        for rank in range(self.settings.dp_ranks):  # one socket; the batch names the rank
            sub.bind(offset_port(self.settings.bind, rank))
        self.sub, self.read = sub, message_reader(sub)
        SocketChanges.note()

    def gone_now(self, stream: StreamSockets, now: float) -> bool:
        """True once, when a fleet publisher passes `gone_after_s` of silence."""
        if not stream.shared or stream.spec.stream in self.gone:
            return False
        heard = stream.ingest.last_message_at
        if heard is None or now - heard < self.settings.gone_after_s:
            return False
        self.gone.add(stream.spec.stream)
        stream.lost_connection(now)
        return True

    def close(self) -> None:
        if self.sub is not None:
            self.sub.close(linger=0)
            self.sub = self.read = None
            SocketChanges.note()
