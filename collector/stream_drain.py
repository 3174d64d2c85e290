"""What the collector's loop does when one stream's own socket is ready: its live SUB, its replay
DEALER, its SUB's monitor; and telling the sink when a stream's connection goes up or down.

Only framing happens here: every decision about sequence, replay and the map is `StreamIngest`'s.
Each call runs on the loop's thread, under `Collector.lock`.
"""

from __future__ import annotations

import logging
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvscope.collector.sink import ConnectionChange, EventSink
from kvscope.collector.sockets import DRAIN_LIMIT, StreamSockets

logger = logging.getLogger("kvscope.collector.subscriber")
"""The collector's log, where these lines have always gone."""


def drain_live(stream: StreamSockets) -> None:
    read, live, now = stream.read, stream.ingest.live_frames, time.time
    assert read is not None
    for _ in range(DRAIN_LIMIT):
        frames = read()
        if frames is None:
            return
        request = live(frames, now())
        if request is not None:
            stream.send_replay(request)


def drain_replay(stream: StreamSockets) -> None:
    dealer = stream.dealer
    while dealer is not None:
        try:
            frames = dealer.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if stream.ingest.replay_frames(frames, time.time()):
            stream.close_dealer()
            request = stream.ingest.take_replay_request()
            if request is not None:
                stream.send_replay(request)  # a restart or a gap showed up meanwhile
            return


def on_monitor(stream: StreamSockets, sink: EventSink | None) -> None:
    assert stream.monitor is not None
    while True:
        try:
            event = recv_monitor_message(stream.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            stream.handshake_done()
            logger.info("%s: connected to %s", stream.spec.stream, stream.spec.endpoint)
            tell_connection(sink, stream, True)
            request = stream.ingest.connected(time.time())
            if request is not None:
                stream.send_replay(request)
        elif kind == zmq.EVENT_DISCONNECTED:
            stream.lost_connection(time.time())
            logger.warning("%s: disconnected from %s", stream.spec.stream, stream.spec.endpoint)
            tell_connection(sink, stream, False)


def tell_connection(sink: EventSink | None, stream: StreamSockets, connected: bool) -> None:
    """Tell the sink when a stream goes up (first peer) or down (last)."""
    if sink is not None and stream.peers == (1 if connected else 0):
        change = ConnectionChange(stream.spec.stream, connected, time.time())
        try:
            sink.connection(change)
        except Exception as exc:  # a broken sink must not stop the loop
            stream.ingest.errors.sink_failed("connection", exc)
