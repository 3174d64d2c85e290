"""What the collector's loop does when a fleet's bound SUB is ready: each message routed to its
publisher's stream, a publisher registered the first time it is heard (started where the store
left it), and one heard again after it was gone brought back.

Each call runs on the loop's thread, under `Collector.lock`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from kvscope.collector._fleet_drain import DrainLoop
from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.fleet import NotNow, StreamStarter
from kvscope.collector.fleet_router import Refusal, Route
from kvscope.collector.fleet_socket import FleetSocket
from kvscope.collector.sink import ResumePoint
from kvscope.collector.sockets import DRAIN_LIMIT, StreamSockets
from kvscope.collector.stream_table import StreamTable
from kvscope.collector.types import StreamId

logger = logging.getLogger("kvscope.collector.subscriber")
"""The collector's log, where these lines have always gone."""

Follow = Callable[[StreamEndpoint, ResumePoint | None], StreamSockets]
"""The collector's: follow one more stream (its ingest and sockets made, a shared SUB's)."""
Tell = Callable[[StreamSockets, bool], None]
"""The collector's: tell the sink a stream's connection went up (True) or down."""


class FleetDrain:
    def __init__(
        self,
        fleet: FleetSocket,
        starter: StreamStarter | None,
        streams: StreamTable[StreamSockets],
        follow: Follow,
        tell: Tell,
    ) -> None:
        """`streams`: the collector's, which a registered publisher's joins (through
        `follow`); `starter`: where such a stream starts, the first time it is heard."""
        self.fleet = fleet
        self._starter = starter
        self._streams = streams
        self._follow = follow
        self._tell = tell

    def drain_safely(self) -> bool:  # True: it emptied the fleet's socket
        try:
            return self.drain()
        except zmq.ZMQError as exc:  # the fleet's socket; the other streams go on
            logger.warning("fleet %s: %s", self.fleet.settings.bind, exc)
            return False

    def drain(self) -> bool:
        """Up to `DRAIN_LIMIT` messages, each routed to its publisher's stream and handed to its
        ingest (collector/_fleet_drain.pyx's loop): True once the socket is empty."""
        assert self.fleet.read is not None
        loop = DrainLoop(
            self.fleet.read,
            self.fleet.router.route_batch,
            time.time,
            self._streams,
            self.fleet.gone,
            self,
        )
        return loop.run(DRAIN_LIMIT)

    def _heard_again(self, stream_id: StreamId, stream: StreamSockets) -> None:
        """A publisher that was gone is heard again (the drain's loop calls it)."""
        self.fleet.gone.discard(stream_id)
        logger.info("%s: heard again", stream_id)
        self._heard(stream, time.time())

    def _register(self, to: Route, now: float) -> StreamSockets | None:
        """A publisher heard for the first time: its stream, started where the store left it;
        None if it must not be followed yet."""
        spec = StreamEndpoint(to.stream, self.fleet.settings.bind, True, to.replay_endpoint)
        point = None
        if self._starter is not None:
            try:
                point = self._starter.resume_point(to.stream)
            except NotNow:
                self.fleet.router.forget(to.stream, Refusal.LEASED)
                return None
            except Exception as exc:  # a store that does not answer: followed from scratch
                logger.warning("%s: no resume point (%s): followed afresh", to.stream, exc)
        stream = self._follow(spec, point)
        logger.info("%s: registered (replay %s)", to.stream, to.replay_endpoint or "none")
        self._heard(stream, now)
        return stream

    def _heard(self, stream: StreamSockets, now: float) -> None:
        """A fleet publisher is up: the replay asks for what came before (or since it was
        last heard: a restart meanwhile shows in the replayed batch, as after a reconnect)."""
        stream.handshake_done()
        self._tell(stream, True)
        request = stream.ingest.connected(now)
        if request is not None:
            stream.send_replay(request)
