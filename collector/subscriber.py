"""The sockets: one SUB per stream, a DEALER per replay, one poll loop for them all.

Only framing happens here; every decision about sequence, replay and the map is `StreamIngest`'s.
The loop runs in one thread and owns the maps; readers take `Collector.lock`.

Times passed to the ingest are wall-clock (`time.time()`): they are reported (degraded since,
last message) and stored, and a recorded stream replays with its recorded receive times.

Boot order matters: a SUB socket loses what is published before its subscription reaches the
publisher (the slow joiner), so each stream asks for a replay once its connection's handshake
has succeeded, not before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvscope.collector import _zmq_recv
from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.ingest import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TAIL_CHECK_AFTER_S,
    StreamIngest,
)
from kvscope.collector.replay import ReplayRequest
from kvscope.collector.sink import ConnectionChange, EventSink, ResumePoint
from kvscope.collector.types import StreamId

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


class _Stream:
    """The sockets of one stream."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        spec: StreamEndpoint,
        ingest: StreamIngest,
        settings: CollectorSettings,
    ) -> None:
        self.spec = spec
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
        self.sub, self.monitor, self.read = self._open_sub()

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
        return True

    def _close_sub(self) -> None:
        self.sub.disable_monitor()
        self.monitor.close(linger=0)
        self.sub.close(linger=0)

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
        return dealer

    def close_dealer(self) -> None:
        if self.dealer is not None:
            self.dealer.close(linger=0)
            self.dealer = None

    def close(self) -> None:
        self.close_dealer()
        self._close_sub()


class Collector:
    """Subscribes to many streams and keeps one `StreamIngest` (and its map) per stream; what
    they do goes to `sink` (collector/sink.py)."""

    def __init__(
        self,
        endpoints: Iterable[StreamEndpoint],
        settings: CollectorSettings | None = None,
        sink: EventSink | None = None,
    ) -> None:
        self.settings = settings or CollectorSettings()
        self.lock = threading.RLock()
        """Held while the loop changes maps; take it to read a consistent map."""
        self.ingests: dict[StreamId, StreamIngest] = {}
        self._specs = list(endpoints)
        self._sink = sink
        for spec in self._specs:
            self.ingests[spec.stream] = StreamIngest(
                spec.stream,
                can_replay=spec.replay_endpoint is not None,
                replay_timeout_s=self.settings.replay_timeout_s,
                max_message_bytes=self.settings.max_message_bytes,
                tail_check_after_s=self.settings.tail_check_after_s,
                sink=sink,
            )
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._streams: dict[StreamId, _Stream] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.failure: str | None = None
        """Why the loop stopped, if it stopped by itself: collection has ended, and /readyz,
        `kvscope_collector_up` and the exit status say so."""

    def resume(self, point: ResumePoint) -> None:
        """Start `point.stream` where a store left off (before `start`)."""
        with self.lock:
            self.ingests[point.stream].resume(point)

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Open the sockets and run the loop in a background thread."""
        self._thread = threading.Thread(target=self.run, name="kvscope-collector", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Collector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self) -> None:
        """The poll loop; returns when `stop()` is called."""
        try:
            self._open()
            self._ready.set()
            self._loop()
        except Exception as exc:  # said, not hidden: see `failure`
            self.failure = f"{type(exc).__name__}: {exc}"
            logger.exception("the collector loop stopped: %s", self.failure)
        finally:
            self._ready.set()
            for stream in self._streams.values():
                stream.close()
            self._streams.clear()
            self._ctx.term()

    # --- reads --------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        """Collecting: the loop runs (or is about to) and has not stopped by itself."""
        return self.failure is None and (self._thread is None or self._thread.is_alive())

    def is_connected(self, stream: StreamId) -> bool:
        s = self._streams.get(stream)
        return s is not None and s.connected

    def connection_counts(self, stream: StreamId) -> tuple[int, int]:
        s = self._streams.get(stream)
        return (0, 0) if s is None else (s.connects, s.disconnects)

    def is_silent(self, stream: StreamId, now: float | None = None) -> bool:
        silent = self.ingests[stream].silent_for(time.time() if now is None else now)
        return silent is None or silent >= self.settings.silent_after_s

    # --- the loop -----------------------------------------------------------------------------
    def _open(self) -> None:
        for spec in self._specs:
            self._streams[spec.stream] = _Stream(
                self._ctx, spec, self.ingests[spec.stream], self.settings
            )

    def _loop(self) -> None:
        poller = zmq.Poller()
        owners: dict[zmq.Socket[bytes], tuple[_Stream, str]] = {}
        registered: tuple[zmq.Socket[bytes], ...] = ()
        while not self._stop.is_set():
            current = {
                sock: (stream, role)
                for stream in self._streams.values()
                for sock, role in (
                    (stream.sub, "live"),
                    (stream.monitor, "monitor"),
                    (stream.dealer, "replay"),
                )
                if sock is not None
            }
            # Sockets change only with replays and reopens: rebuild the poller only then.
            if tuple(current) != registered:
                poller, owners, registered = zmq.Poller(), current, tuple(current)
                for sock in registered:
                    poller.register(sock, zmq.POLLIN)
            for sock, _ in poller.poll(POLL_MS):
                stream, role = owners[sock]
                with self.lock:
                    try:
                        if role == "live":
                            self._drain_live(stream)
                        elif role == "replay":
                            self._drain_replay(stream)
                        else:
                            self._on_monitor(stream)
                    except zmq.ZMQError as exc:  # this stream's sockets; the others go on
                        stream.ingest.errors.socket_failed(role, exc)
            now = time.time()
            with self.lock:
                for stream in self._streams.values():
                    try:
                        self._tend(stream, now)
                    except zmq.ZMQError as exc:
                        stream.ingest.errors.socket_failed("tick", exc)

    def _tend(self, stream: _Stream, now: float) -> None:
        """Timers: reopen a socket, give up on a replay, check a silent stream's tail."""
        if stream.reopen_if_due(now):
            logger.info("%s: reopened %s", stream.spec.stream, stream.spec.endpoint)
        was_replaying = stream.ingest.replaying
        request = stream.ingest.tick(now)
        if was_replaying and not stream.ingest.replaying:
            stream.close_dealer()
        if request is not None:
            stream.send_replay(request)

    def _drain_live(self, stream: _Stream) -> None:
        read, live, now = stream.read, stream.ingest.live_frames, time.time
        for _ in range(DRAIN_LIMIT):
            frames = read()
            if frames is None:
                return
            request = live(frames, now())
            if request is not None:
                stream.send_replay(request)

    def _drain_replay(self, stream: _Stream) -> None:
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

    def _on_monitor(self, stream: _Stream) -> None:
        while True:
            try:
                event = recv_monitor_message(stream.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                stream.handshake_done()
                logger.info("%s: connected to %s", stream.spec.stream, stream.spec.endpoint)
                self._tell_connection(stream, True)
                request = stream.ingest.connected(time.time())
                if request is not None:
                    stream.send_replay(request)
            elif kind == zmq.EVENT_DISCONNECTED:
                stream.lost_connection(time.time())
                logger.warning("%s: disconnected from %s", stream.spec.stream, stream.spec.endpoint)
                self._tell_connection(stream, False)

    def _tell_connection(self, stream: _Stream, connected: bool) -> None:
        """Tell the sink when a stream goes up (first peer) or down (last)."""
        if self._sink is not None and stream.peers == (1 if connected else 0):
            change = ConnectionChange(stream.spec.stream, connected, time.time())
            try:
                self._sink.connection(change)
            except Exception as exc:  # a broken sink must not stop the loop
                stream.ingest.errors.sink_failed("connection", exc)
