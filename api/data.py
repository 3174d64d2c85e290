"""Where the API reads from: the live collector (in `kvscope serve`) and the store.

`kvscope serve` has both: "now" is the collector's map, the past comes from the store.
`kvscope api` has only a store written by other processes: "now" is the last stored batch,
and responses say how old it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, func, select

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.history import (
    NotInStore,
    Position,
    position_at_time,
    rebuild,
    stream_id,
)
from kvscope.storage.writer import StoreWriter


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
    ) -> None:
        self.collector = collector
        self.engine = engine
        self.writer = writer
        self.clock = clock
        self._cache: dict[tuple[StreamId, int, int, float | None], tuple[PrefixMap, list[str]]] = {}
        """Rebuilt maps are immutable once built (reads only): keep the last few."""
        self._cache_lock = threading.Lock()
        self._stored_streams: tuple[float, set[StreamId]] | None = None

    # --- which streams ------------------------------------------------------------------------
    def streams(self) -> list[StreamId]:
        """The live streams and those the store knows (that list is re-read every few s)."""
        found: set[StreamId] = set()
        if self.collector is not None:
            found.update(self.collector.ingests)
        if self.engine is not None:
            now = self.clock()
            if self._stored_streams is None or now - self._stored_streams[0] > STREAMS_TTL_S:
                with self.engine.connect() as conn:
                    rows = conn.execute(select(schema.streams.c.replica, schema.streams.c.rank))
                    self._stored_streams = (now, {StreamId(r.replica, r.rank) for r in rows})
            found.update(self._stored_streams[1])
        return sorted(found, key=lambda s: (s.replica, s.rank))

    def replica_streams(self, replica: str) -> list[StreamId]:
        return [s for s in self.streams() if s.replica == replica]

    # --- maps ---------------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """Held while a live map is read (the collector's loop writes it)."""
        if self.collector is None:
            yield
        else:
            with self.collector.lock:
                yield

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
        with self.engine.connect() as conn:
            sid = stream_id(conn, stream.replica, stream.rank)
            position = position_at_time(conn, sid, at if at is not None else float("inf"))
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
        b = schema.batches
        received: float | None = conn.execute(
            select(b.c.recv_ts).where(
                b.c.stream_id == position.stream_id,
                b.c.epoch == position.epoch,
                b.c.seq == position.seq,
            )
        ).scalar_one_or_none()
        return received

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
