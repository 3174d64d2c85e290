"""The sockets: one SUB per stream, a DEALER per replay, one poll loop for them all.

Only framing happens here; every decision about sequence, replay and the map is `StreamIngest`'s.
The loop runs in one thread and owns the maps; readers take `Collector.lock`.

Times passed to the ingest are wall-clock (`time.time()`): they are reported (degraded since,
last message) and stored, and a recorded stream replays with its recorded receive times.

Boot order matters: a SUB socket loses what is published before its subscription reaches the
publisher (the slow joiner), so each stream asks for a replay once its connection's handshake
has succeeded, not before.

What a ready socket is read into: a stream's own (collector/stream_drain.py), a fleet's bound
SUB (collector/fleet_drain.py).
"""

from __future__ import annotations

import gc
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import zmq

from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.fleet import FleetSettings, StreamStarter
from kvscope.collector.fleet_drain import FleetDrain
from kvscope.collector.fleet_socket import GATHER_S, FleetSocket
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import EventSink, ResumePoint
from kvscope.collector.sockets import POLL_MS, SocketChanges, StreamSockets, loop_sockets
from kvscope.collector.sockets import CollectorSettings as CollectorSettings
from kvscope.collector.sockets import MessageReader as MessageReader
from kvscope.collector.sockets import message_reader as message_reader
from kvscope.collector.sockets import recv_message as recv_message
from kvscope.collector.stream_drain import drain_live, drain_replay, on_monitor, tell_connection
from kvscope.collector.stream_table import StreamTable
from kvscope.collector.types import StreamId

logger = logging.getLogger(__name__)

TEND_EVERY_S = 0.02
"""Timers (replays, tail checks, reopens, gone publishers; spans of seconds) are checked this
often at most, not at each wake-up: a fleet wakes the loop often, and a check walks all streams."""


class Collector:
    """Subscribes to many streams and keeps one `StreamIngest` (and its map) per stream; what
    they do goes to `sink` (collector/sink.py)."""

    def __init__(
        self,
        endpoints: Iterable[StreamEndpoint],
        settings: CollectorSettings | None = None,
        sink: EventSink | None = None,
        fleet: FleetSettings | None = None,
        starter: StreamStarter | None = None,
    ) -> None:
        """`fleet`: also bind its address and follow every publisher that connects to it
        (collector/fleet.py); `starter`: where such a stream starts, the first time it is heard."""
        self.settings = settings or CollectorSettings()
        self.lock = threading.RLock()
        """Held while the loop changes maps; take it to read a consistent map."""
        self.ingests: dict[StreamId, StreamIngest] = {}
        self._specs = list(endpoints)
        self._sink = sink
        for spec in self._specs:
            self.ingests[spec.stream] = self._new_ingest(spec)
        self.fleet = None if fleet is None else FleetSocket(fleet, self.ingests)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._streams: StreamTable[StreamSockets] = StreamTable()
        self._fleet_drain = (
            None
            if self.fleet is None
            else FleetDrain(self.fleet, starter, self._streams, self._follow, self._tell_connection)
        )
        self._stop = threading.Event()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.failure: str | None = None
        """Why the loop stopped, if it stopped by itself: collection has ended, and /readyz,
        `kvscope_collector_up` and the exit status say so."""

    def _new_ingest(self, spec: StreamEndpoint) -> StreamIngest:
        ingest = StreamIngest(
            spec.stream,
            can_replay=spec.replay_endpoint is not None,
            replay_timeout_s=self.settings.replay_timeout_s,
            max_message_bytes=self.settings.max_message_bytes,
            tail_check_after_s=self.settings.tail_check_after_s,
            sink=self._sink,
            engine=spec.engine,
            limits=self.settings.limits,
        )
        return ingest

    def resume(self, point: ResumePoint) -> None:
        """Start `point.stream` where a store left off (before `start`)."""
        with self.lock:
            self.ingests[point.stream].resume(point)

    def call_soon(self, call: Callable[[], Any]) -> Future[Any]:
        """Run `call` on the loop's thread (which owns the sockets and the maps), under the
        lock, at its next turn; its result or exception in the future."""
        done: Future[Any] = Future()
        self._calls.put((call, done))
        return done

    def add_stream(self, spec: StreamEndpoint, point: ResumePoint | None) -> None:
        """Follow one more stream, from `point` if given (on the loop's thread: `call_soon`)."""
        self._follow(spec, point, shared=False)

    def _follow(
        self, spec: StreamEndpoint, point: ResumePoint | None, shared: bool = True
    ) -> StreamSockets:
        """A stream's ingest, from `point` if given, and its sockets (`shared`: a fleet's)."""
        ingest = self._new_ingest(spec)
        if point is not None:
            ingest.resume(point)
        # Replaced, not changed: readers iterate the dict without the lock.
        self.ingests = {**self.ingests, spec.stream: ingest}
        stream = StreamSockets(self._ctx, spec, ingest, self.settings, shared=shared)
        self._streams.put(spec.stream, stream)
        return stream

    def remove_stream(self, stream: StreamId) -> None:
        """Stop following a stream (added by `add_stream`, or a fleet's): its sockets close,
        its map goes (on the loop's thread: `call_soon`)."""
        sockets = self._streams.pop(stream)
        if sockets is not None:
            sockets.close()
        self.ingests = {k: v for k, v in self.ingests.items() if k != stream}
        if self.fleet is not None:  # a fleet's publisher: registered afresh when next heard
            self.fleet.router.forget(stream)
            self.fleet.gone.discard(stream)

    def _run_calls(self) -> None:
        while True:
            try:
                call, done = self._calls.get_nowait()
            except queue.Empty:
                return
            if not done.set_running_or_notify_cancel():
                continue
            try:
                with self.lock:
                    done.set_result(call())
            except Exception as exc:  # the caller's to handle
                done.set_exception(exc)

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
            if not gc.get_freeze_count():  # once: a test's process starts many collectors
                gc.freeze()  # start-up's objects live for good: no full collection walks them
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
            if self.fleet is not None:
                self.fleet.close()
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

    def is_gone(self, stream: StreamId) -> bool:
        """A fleet's publisher silent past `gone_after_s` (kept, revived if it speaks again)."""
        return self.fleet is not None and stream in self.fleet.gone

    def is_silent(self, stream: StreamId, now: float | None = None) -> bool:
        silent = self.ingests[stream].silent_for(time.time() if now is None else now)
        return silent is None or silent >= self.settings.silent_after_s

    # --- the loop -----------------------------------------------------------------------------
    def _open(self) -> None:
        for spec in self._specs:
            self._streams.put(
                spec.stream,
                StreamSockets(self._ctx, spec, self.ingests[spec.stream], self.settings),
            )
        if self.fleet is not None:
            self.fleet.open(self._ctx, self.settings)

    def _loop(self) -> None:
        poller = zmq.Poller()
        owners: dict[zmq.Socket[bytes], tuple[StreamSockets | None, str]] = {}
        registered: tuple[zmq.Socket[bytes], ...] = ()
        seen, tended = -1, -math.inf
        while not self._stop.is_set():
            # Sockets change only with replays, reopens and streams: rebuild the poller then.
            if SocketChanges.latest != seen:
                seen = SocketChanges.latest  # before the walk: a change meanwhile walks again
                fleet_sub = self.fleet.sub if self.fleet is not None else None
                current = loop_sockets(self._streams.values(), fleet_sub)
                if tuple(current) != registered:
                    poller, owners, registered = zmq.Poller(), current, tuple(current)
                    for sock in registered:
                        poller.register(sock, zmq.POLLIN)
            if not registered:  # no stream yet (leases give them): zmq_poll would not wait
                self._stop.wait(POLL_MS / 1000)
            gather, started = False, time.monotonic()
            for sock, _ in poller.poll(POLL_MS) if registered else ():
                stream, role = owners[sock]
                with self.lock:
                    if stream is None:
                        assert self._fleet_drain is not None
                        gather = self._fleet_drain.drain_safely()
                        continue
                    try:
                        if role == "live":
                            drain_live(stream)
                        elif role == "replay":
                            drain_replay(stream)
                        else:
                            on_monitor(stream, self._sink)
                    except zmq.ZMQError as exc:  # this stream's sockets; the others go on
                        stream.ingest.errors.socket_failed(role, exc)
            self._run_calls()
            if gather:  # the fleet's socket was emptied: its messages gather till GATHER_S on
                self._stop.wait(max(0.0, started + GATHER_S - time.monotonic()))
            now = time.time()
            if abs(now - tended) < TEND_EVERY_S:
                continue
            tended = now
            with self.lock:
                for stream in self._streams.values():
                    try:
                        self._tend(stream, now)
                    except zmq.ZMQError as exc:
                        stream.ingest.errors.socket_failed("tick", exc)

    def _tend(self, stream: StreamSockets, now: float) -> None:
        """Timers: reopen a socket, give up on a replay, check a silent stream's tail, mark a
        silent fleet publisher gone."""
        if self.fleet is not None and self.fleet.gone_now(stream, now):
            logger.info("%s: silent for %.0f s, gone", stream.spec.stream, self.fleet.gone_after_s)
            self._tell_connection(stream, False)
        if stream.reopen_if_due(now):
            logger.info("%s: reopened %s", stream.spec.stream, stream.spec.endpoint)
        was_replaying = stream.ingest.replaying
        request = stream.ingest.tick(now)
        if was_replaying and not stream.ingest.replaying:
            stream.close_dealer()
        if request is not None:
            stream.send_replay(request)

    def _tell_connection(self, stream: StreamSockets, connected: bool) -> None:
        tell_connection(self._sink, stream, connected)
