"""Where the API reads from: the live collector (in `kvscope serve`) and the store.

`kvscope serve` has both: "now" is the collector's map, the past comes from the store.
`kvscope api` has only a store written by other processes: "now" is the last stored batch,
and responses say how old it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.history import (
    NotInStore,
    Position,
    position_at_time,
    rebuild,
    stream_id,
)
from kvscope.storage.lease_keeper import LeaseKeeper
from kvscope.storage.writer import StoreWriter

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger, interval_s=60.0)
WRITER_WAIT_S = 2.0
"""How long a store read waits for the writer to store what was queued before it."""
WRITER_BEHIND = (
    "the store's writer is behind (the store is slow or refuses writes): batches of this "
    "instant may not be stored yet"
)


@dataclass
class MapView:
    """A map and where it stands: hold `lock` while reading a live one."""

    map: PrefixMap
    source: str
    """live (the collector's map now), store (rebuilt from the store)"""
    epoch: int
    seq: int | None
    ts: float | None
    """Batch time of the last batch in the map."""
    age_s: float | None
    """How old the map may be: for a store-only API, seconds since that batch was stored."""
    unknown_because: list[str] = field(default_factory=list)


CACHED_MAPS = 16
STREAMS_TTL_S = 5.0


class ApiData:
    def __init__(
        self,
        collector: Collector | None = None,
        engine: Engine | None = None,
        writer: StoreWriter | None = None,
        clock: Callable[[], float] = time.time,
        leases: LeaseKeeper | None = None,
    ) -> None:
        self.collector = collector
        self.engine = engine
        self.writer = writer
        self.leases = leases
        """With `--lease`: which streams this collector holds, known once its rounds settle."""
        self.clock = clock
        self._cache: dict[tuple[StreamId, int, int, float | None], tuple[PrefixMap, list[str]]] = {}
        """Rebuilt maps are immutable once built (reads only): keep the last few."""
        self._cache_lock = threading.Lock()
        self._stored_streams: tuple[float, set[StreamId]] | None = None
        """When the store's list was read, and the list."""
        self._streams_tried_at = 0.0
        self._reading_streams = threading.Lock()
        self._sorted_streams: (
            tuple[int, tuple[float, set[StreamId]] | None, list[StreamId]] | None
        ) = None

    # --- which streams ------------------------------------------------------------------------
    def streams(self) -> list[StreamId]:
        """The live streams and those the store knows (that list is re-read every few s).

        While the store does not answer, the list last read is kept (and it is tried again
        every few s): the live streams go on being answered. Raises only when the store never
        answered, as there is no list to keep.
        """
        # One caller re-reads the store's list; the others go on with the one it replaces (a
        # few seconds old) instead of all reading it at once, except before the first read.
        if (
            self.engine is not None
            and self._stored_streams_due()
            and self._reading_streams.acquire(blocking=self._stored_streams is None)
        ):
            try:
                if self._stored_streams_due():
                    self._read_stored_streams(self.engine)
            finally:
                self._reading_streams.release()
        return self._known_streams()

    def _read_stored_streams(self, engine: Engine) -> None:
        self._streams_tried_at = self.clock()
        try:
            with engine.connect() as conn:
                rows = conn.execute(select(schema.streams.c.replica, schema.streams.c.rank))
                read = {StreamId(r.replica, r.rank) for r in rows}
        except SQLAlchemyError as exc:
            if self._stored_streams is None:
                raise
            age = self.clock() - self._stored_streams[0]
            _log.warning(
                "streams",
                "the store does not answer (%s): the streams are those it listed %.0f s ago",
                type(exc).__name__,
                age,
            )
            return
        self._stored_streams = (self.clock(), read)

    def streams_unless_due(self) -> list[StreamId] | None:
        """`streams()` without reading the store (a route in the event loop must not wait for
        it): None where `streams()` would read it now."""
        due = self._stored_streams_due() and (
            self._stored_streams is None or not self._reading_streams.locked()
        )
        return None if due else self._known_streams()

    def _stored_streams_due(self) -> bool:
        return self.engine is not None and (
            self._stored_streams is None or self.clock() - self._streams_tried_at > STREAMS_TTL_S
        )

    def _known_streams(self) -> list[StreamId]:
        # Sorted again only when either list changed, not per request.
        stored = self._stored_streams
        live = 0 if self.collector is None else len(self.collector.ingests)
        cached = self._sorted_streams
        if cached is None or cached[0] != live or cached[1] is not stored:
            found: set[StreamId] = set()
            if self.collector is not None:
                found.update(self.collector.ingests)
            if stored is not None:
                found.update(stored[1])
            cached = self._sorted_streams = (
                live,
                stored,
                sorted(found, key=lambda s: (s.replica, s.rank)),
            )
        return list(cached[2])

    def replica_streams(self, replica: str) -> list[StreamId]:
        return [s for s in self.streams() if s.replica == replica]

    # --- maps ---------------------------------------------------------------------------------
    @contextmanager
    def lock(self, wait: bool = True) -> Iterator[bool]:
        """Held while a live map is read (the collector's loop writes it); yields True.

        With `wait=False` it is taken only if it is free now, and yields whether it was: an
        async route must not stall its event loop (every request) while ingest holds it.
        """
        if self.collector is None:
            yield True
        elif self.collector.lock.acquire(blocking=wait):
            try:
                yield True
            finally:
                self.collector.lock.release()
        else:
            yield False

    def live_map(self, stream: StreamId) -> PrefixMap | None:
        """The collector's map of `stream`, if it follows it; call with `lock()` held."""
        ingest = None if self.collector is None else self.collector.ingests.get(stream)
        return None if ingest is None else ingest.map

    def map_now(self, stream: StreamId) -> MapView:
        """Call with `lock()` held."""
        if self.collector is not None and stream in self.collector.ingests:
            ingest = self.collector.ingests[stream]
            return MapView(
                map=ingest.map,
                source="live",
                epoch=ingest.epoch,
                seq=ingest.last_seq,
                ts=ingest.map.counters.last_ts,
                age_s=0.0,
                unknown_because=[ingest.degraded.reason] if ingest.degraded else [],
            )
        return self._stored(stream, None)

    def map_at(self, stream: StreamId, at: float) -> MapView:
        return self._stored(stream, at)

    def _stored(self, stream: StreamId, at: float | None) -> MapView:
        if self.engine is None:
            raise NotInStore("this API keeps no store: only the live map is known")
        # The batches up to now may still wait in the writer's queue: an instant they belong
        # to would be rebuilt without them. Beside a collector it holds only the collector's
        # streams: a stream only the store knows has nothing to wait for (nor, while the store
        # is down, a reason to wait at all).
        followed = self.collector is None or stream in self.collector.ingests
        caught_up = self.writer is None or not followed or self.writer.flush(WRITER_WAIT_S)
        instant = at if at is not None else float("inf")
        with self.engine.connect() as conn:
            sid = stream_id(conn, stream.replica, stream.rank)
            position = position_at_time(conn, sid, instant)
            stored_at = self._stored_at(conn, position) if at is None else None
            key = (stream, position.epoch, position.seq, at)
            with self._cache_lock:
                cached = self._cache.get(key)
            if cached is None:
                rebuilt = rebuild(conn, position, stream)
                cached = (rebuilt.map, rebuilt.unknown_because)
                with self._cache_lock:
                    if len(self._cache) >= CACHED_MAPS:
                        self._cache.pop(next(iter(self._cache)))
                    self._cache[key] = cached
            prefix_map, unknown = cached
            if not caught_up and not batch_log.holds_later(conn, sid, instant):
                # Not cached: once the writer catches up, the same position is whole again.
                unknown = [*unknown, WRITER_BEHIND]
        return MapView(
            map=prefix_map,
            source="store",
            epoch=position.epoch,
            seq=position.seq,
            ts=position.ts,
            age_s=None if stored_at is None else max(0.0, self.clock() - stored_at),
            unknown_because=unknown,
        )

    @staticmethod
    def _stored_at(conn: Connection, position: Position) -> float | None:
        """When the batch at `position` was received: how old a store-only "now" is."""
        found = batch_log.batch_at(conn, position.stream_id, position.epoch, position.seq)
        return None if found is None else found.recv_ts

    def has_store(self) -> bool:
        return self.engine is not None

    def store_reachable(self) -> bool:
        if self.engine is None:
            return True
        try:
            with self.engine.connect() as conn:
                conn.execute(select(func.count()).select_from(schema.streams)).scalar()
            return True
        except Exception:
            return False
