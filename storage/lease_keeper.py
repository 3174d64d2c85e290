"""A collector's share of the streams, kept through leases (storage/leases.py).

Every `renew_s` the keeper beats (the member stays alive; a thread of its own) and, on its
other thread, reads the live members and the leases and moves streams: a configured stream
whose rendezvous owner is this member is taken (a free lease, or one whose owner stopped
beating) and resumed exactly as after a crash (the store's resume point, then the publisher's
replay); one whose owner is now another member is given up gracefully (its sockets closed, its
queued rows written, then released); one whose lease names another member now (taken over
while this one did not beat) is dropped at once, and its queued rows are refused by the
writer's fence. A stream the writer's fence refused is dropped the same way. Before a stream
let go is taken again, the writer drains what it queued.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import Engine

from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.sink import ResumePoint
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.storage import leases
from kvscope.storage.leases import Fence, LeaseSettings
from kvscope.storage.writer import StoreWriter

logger = logging.getLogger(__name__)
CALL_TIMEOUT_S = 30.0


def member_id() -> str:
    """Unique per process: a restarted collector is a new member, never its old self."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class LeaseKeeper:
    def __init__(
        self,
        engine: Engine,
        endpoints: Sequence[StreamEndpoint],
        collector: Collector,
        writer: StoreWriter,
        fence: Fence,
        resume_point: Callable[[StreamId], ResumePoint | None],
        settings: LeaseSettings | None = None,
    ) -> None:
        leases.check_backend(engine.dialect.name)
        self.engine = engine
        self.member = fence.member
        self.settings = settings or LeaseSettings()
        self.stats = fence.stats
        self._specs = {spec.stream: spec for spec in endpoints}
        self._collector = collector
        self._writer = writer
        self._fence = fence
        self._resume_point = resume_point
        self._running: set[StreamId] = set()
        """Streams this member follows (a held stream not in it is being given up)."""
        self._undrained = fence.draining
        self._refused: set[StreamId] = set()
        self._refused_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvscope-leases", daemon=True)
        self._left = threading.Event()
        self._beat = threading.Thread(target=self._beating, name="kvscope-beat", daemon=True)
        self._unsettled: str | None = (
            "the first lease round (which streams this collector holds) has not run yet"
        )

    def fenced(self, stream: StreamId) -> None:
        """The writer's fence refused rows of `stream` (from the writer's thread)."""
        with self._refused_lock:
            self._refused.add(stream)

    @contextmanager
    def membership(self) -> Iterator[None]:
        """A member while the block runs; on the way out (after the writer has flushed), its
        leases are released so that others take them over at once."""
        with self.engine.begin() as conn:
            leases.heartbeat(conn, self.member, self.settings.ttl_s)
        logger.info("lease member %s joined", self.member)
        self._beat.start()
        try:
            yield
        finally:
            self._left.set()
            self._beat.join()
            try:
                with self.engine.begin() as conn:
                    leases.leave(conn, self.member)
                logger.info("lease member %s left: its leases released at exit", self.member)
            except Exception as exc:  # they expire by themselves
                logger.warning(
                    "leases not released (%s): they expire in %.0f s", exc, self.settings.ttl_s
                )

    @contextmanager
    def keeping(self) -> Iterator[None]:
        """Move streams while the block runs (the collector running)."""
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()

    def _beating(self) -> None:
        """Its own thread: moving streams (flushes, resumes) never delays a heartbeat."""
        while not self._left.wait(self.settings.renew_s):
            try:
                with self.engine.begin() as conn:
                    leases.heartbeat(conn, self.member, self.settings.ttl_s)
            except Exception as exc:  # a store that does not answer: the next beat tries again
                logger.warning("lease heartbeat: %s: %s", type(exc).__name__, exc)

    def _run(self) -> None:
        # A turn first: members starting together then see each other, and none takes all.
        while not self._stop.wait(self.settings.renew_s):
            self.turn()

    def unsettled(self) -> str | None:
        """Why this member does not know which streams it holds (not ready: /readyz), or None
        once its last round completed."""
        return self._unsettled

    def turn(self) -> None:
        """One round, as the keeper's thread runs it: a failure is logged and kept as the
        reason this member is unsettled until a round completes again."""
        try:
            self.tick()
        except Exception as exc:  # a store that does not answer: the next turn tries again
            logger.warning("leases: %s: %s", type(exc).__name__, exc)
            self._unsettled = (
                f"the last lease round failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}): which streams this "
                "collector holds is not known"
            )
        else:
            self._unsettled = None

    def tick(self) -> None:
        with self.engine.begin() as conn:
            leases.forget_dead(conn)
            members = leases.live_members(conn)
            mine = leases.owned(conn, self.member)
        with self._refused_lock:
            refused, self._refused = self._refused, set()
        for stream, token in self._fence.held().items():
            if mine.get(stream) != token or stream in refused:
                self._lose(stream)
        for stream in list(self._undrained):
            if stream not in self._running:
                self._let_go(stream)
        for stream in self._specs:
            should = leases.owner_of(stream, members) == self.member
            if should and stream not in self._fence.held() and stream not in self._undrained:
                self._take(stream)
            elif not should and stream in self._running:
                self._give_up(stream)
        for stream in self._fence.held().keys() - self._specs.keys():
            if self._collector.is_gone(stream):  # a fleet's: it may speak to another now
                self._give_up(stream)

    def _take(self, stream: StreamId) -> None:
        with self.engine.begin() as conn:
            grant = leases.acquire(conn, stream, self.member)
        if grant is None:
            return  # a live member holds it: it lets go at its next turn
        self._fence.hold(stream, grant.token)
        spec = self._specs[stream]

        def start() -> None:
            self._collector.add_stream(spec, self._resume_point(stream))

        try:
            self._collector.call_soon(start).result(CALL_TIMEOUT_S)
        except Exception as exc:
            logger.warning("%s: not resumed (%s): lease given back", stream, exc)
            self._undrained.add(stream)
            self._let_go(stream)
            return
        self._running.add(stream)
        self.stats.acquired += 1
        self.stats.takeovers += grant.takeover
        logger.info(
            "%s: lease %d %s", stream, grant.token, "taken over" if grant.takeover else "taken"
        )

    def _stop_following(self, stream: StreamId) -> None:
        def stop() -> None:
            self._collector.remove_stream(stream)
            self._writer.forget(stream)

        self._running.discard(stream)
        self._undrained.add(stream)
        self._collector.call_soon(stop).result(CALL_TIMEOUT_S)

    def _give_up(self, stream: StreamId) -> None:
        """Another member should hold it: stop, write what is queued, release."""
        self._stop_following(stream)
        self._let_go(stream)

    def _let_go(self, stream: StreamId) -> None:
        if not self._writer.flush(self.settings.ttl_s):
            return  # the next turn tries again
        token = self._fence.held().get(stream)
        if token is not None:
            with self.engine.begin() as conn:
                leases.release(conn, stream, self.member, token)
            self._fence.drop(stream)
            self.stats.released += 1
            logger.info("%s: lease %d released", stream, token)
        self._undrained.discard(stream)

    def _lose(self, stream: StreamId) -> None:
        """Taken by another member: nothing more of it is written here."""
        logger.warning("%s: lease lost to another collector; stream dropped", stream)
        self._fence.drop(stream)
        self.stats.lost += 1
        self._stop_following(stream)  # a fleet's publisher too: it asks again when next heard
