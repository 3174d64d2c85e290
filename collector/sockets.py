"""One stream's sockets (its SUB, its monitor, a DEALER per replay) and reading messages fast.

`Collector` (collector/subscriber.py) polls them; a fleet's streams (collector/fleet.py) share
the fleet's one bound SUB, so theirs is absent and only the replay DEALER is their own.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq

from kvscope.collector import _zmq_recv
from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.ingest import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TAIL_CHECK_AFTER_S,
    StreamIngest,
)
from kvscope.collector.limits import DEFAULT_LIMITS, IngestLimits
from kvscope.collector.replay import ReplayRequest

logger = logging.getLogger(__name__)

POLL_MS = 50
DRAIN_LIMIT = 1000
"""Messages taken from one socket before the loop looks at the others."""
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 5000
"""libzmq reconnects by itself, backing off exponentially between these two."""
_MONITORED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED


def recv_message(sock: zmq.Socket[bytes], flags: int = 0) -> list[bytes]:
    """One whole message, its frames as bytes: what `recv_multipart` returns, at less cost.

    Made for the three frames of a live message: each is received as a `Frame`, whose `more`
    is read from libzmq directly, where `recv_multipart` asks `getsockopt(RCVMORE)` per frame
    (slow in pyzmq). A message of any other length is read whole, for the ingest to count, but
    only its first four frames are kept. `flags` apply to the first frame: the rest came with it.
    """
    recv = sock.recv
    first = recv(flags, False)
    if not first.more:
        return [first.bytes]
    second = recv(0, False)
    if not second.more:
        return [first.bytes, second.bytes]
    third = recv(0, False)
    frames = [first.bytes, second.bytes, third.bytes]
    more = third.more
    while more:
        frame = recv(0, False)
        if len(frames) < _zmq_recv.MAX_FRAMES_KEPT:
            frames.append(frame.bytes)  # past that, dropped uncopied: refused all the same
        more = frame.more
    return frames


MessageReader = Callable[[], list[bytes] | None]
"""Receives the next whole message without waiting: its frames, or None when none waits."""


def message_reader(sock: zmq.Socket[bytes]) -> MessageReader:
    """A `MessageReader` for `sock`: libzmq's own calls where they were found (a third of the
    cost, collector/_zmq_recv.pyx), else pyzmq's `recv_message`."""
    if _zmq_recv.available():
        return _zmq_recv.MessageReceiver(sock)

    def read() -> list[bytes] | None:
        try:
            return recv_message(sock, zmq.NOBLOCK)
        except zmq.Again:
            return None

    return read


@dataclass(frozen=True, slots=True)
class CollectorSettings:
    replay_timeout_s: float = 5.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    silent_after_s: float = 30.0
    """A stream with no message for this long is reported silent (idle engines send nothing)."""
    tail_check_after_s: float = DEFAULT_TAIL_CHECK_AFTER_S
    """After this long with no message, the replay socket is asked for a lost tail."""
    rcvhwm: int = 100_000
    """SUB receive high-water mark, in messages: what a stalled collector holds of a
    publisher's backlog. Past it libzmq drops, and the seq gap that leaves is replayed."""
    limits: IngestLimits = DEFAULT_LIMITS
    """Each stream's (collector/limits.py): `[collector]` keys named as its fields."""


class SocketChanges:
    """`latest` takes a value it never had whenever a socket opens or closes: the poll loop
    rebuilds its poller only then, not at every wake-up (each value is written once)."""

    _values = itertools.count(1)
    latest = 0

    @classmethod
    def note(cls) -> None:
        cls.latest = next(cls._values)


class StreamSockets:
    """The sockets of one stream; `shared`: a fleet's, heard on the fleet's SUB (no own SUB)."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        spec: StreamEndpoint,
        ingest: StreamIngest,
        settings: CollectorSettings,
        shared: bool = False,
    ) -> None:
        self.spec = spec
        self.shared = shared
        self.ingest = ingest
        self.settings = settings
        self.ctx = ctx
        self.dealer: zmq.Socket[bytes] | None = None
        self.peers = 0
        self.connects = 0
        self.disconnects = 0
        self.reopen_at: float | None = None
        """When to replace a SUB whose connection libzmq will not re-establish by itself."""
        self._backoff_s = RECONNECT_IVL_MS / 1000
        self.sub: zmq.Socket[bytes] | None = None
        self.monitor: zmq.Socket[bytes] | None = None
        self.read: MessageReader | None = None
        if not shared:
            self.sub, self.monitor, self.read = self._open_sub()
            SocketChanges.note()

    def _open_sub(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes], MessageReader]:
        """A new SUB socket, its monitor and its reader."""
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.spec.topic)
        sub.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        sub.setsockopt(zmq.RCVHWM, self.settings.rcvhwm)
        sub.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        sub.setsockopt(zmq.LINGER, 0)
        monitor = sub.get_monitor_socket(_MONITORED)
        if self.spec.bind:
            sub.bind(self.spec.endpoint)
        else:
            sub.connect(self.spec.endpoint)
        return sub, monitor, message_reader(sub)

    def lost_connection(self, now: float) -> None:
        """libzmq does not reconnect after some errors (an oversize message is a protocol
        error), so a connecting SUB that stays down is replaced, with exponential backoff."""
        self.peers = max(0, self.peers - 1)
        self.disconnects += 1
        if not self.spec.bind and self.reopen_at is None:
            self.reopen_at = now + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, RECONNECT_IVL_MAX_MS / 1000)

    def handshake_done(self) -> None:
        self.peers += 1
        self.connects += 1
        self.reopen_at = None
        self._backoff_s = RECONNECT_IVL_MS / 1000

    def reopen_if_due(self, now: float) -> bool:
        if self.reopen_at is None or now < self.reopen_at or self.connected:
            return False
        self.reopen_at = None
        self._close_sub()
        self.sub, self.monitor, self.read = self._open_sub()
        SocketChanges.note()
        return True

    def _close_sub(self) -> None:
        if self.sub is None or self.monitor is None:
            return
        self.sub.disable_monitor()
        self.monitor.close(linger=0)
        self.sub.close(linger=0)
        SocketChanges.note()

    @property
    def connected(self) -> bool:
        return self.peers > 0

    def send_replay(self, request: ReplayRequest) -> zmq.Socket[bytes]:
        """A fresh DEALER per replay, so a late answer to an abandoned one can never mix in."""
        self.close_dealer()
        assert self.spec.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        dealer.connect(self.spec.replay_endpoint)
        # [empty delimiter, start seq]: what vLLM's ROUTER expects after the identity frame.
        dealer.send_multipart([b"", request.start_seq.to_bytes(8, "big")])
        self.dealer = dealer
        SocketChanges.note()
        return dealer

    def close_dealer(self) -> None:
        if self.dealer is not None:
            self.dealer.close(linger=0)
            self.dealer = None
            SocketChanges.note()

    def close(self) -> None:
        self.close_dealer()
        self._close_sub()


def loop_sockets(
    streams: Iterable[StreamSockets], fleet_sub: zmq.Socket[bytes] | None
) -> dict[zmq.Socket[bytes], tuple[StreamSockets | None, str]]:
    """Each open socket the collector's loop polls, with its stream (None: the fleet's) and
    role."""
    current: dict[zmq.Socket[bytes], tuple[StreamSockets | None, str]] = {
        sock: (stream, role)
        for stream in streams
        for sock, role in (
            (stream.sub, "live"),
            (stream.monitor, "monitor"),
            (stream.dealer, "replay"),
        )
        if sock is not None
    }
    if fleet_sub is not None:
        current[fleet_sub] = (None, "fleet")
    return current
