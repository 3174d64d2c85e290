"""The collector's followed streams by `StreamId`, with a version that every change bumps: what
the fleet's drain keeps of a route's stream (collector/_fleet_drain.pyx) holds only while the
version is the one it was kept at, so a stream replaced, removed or re-added under a route is
never served stale. Every change goes through `put`, `pop` and `clear`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from kvscope.collector.types import StreamId

S = TypeVar("S")


class StreamTable(Generic[S]):
    __slots__ = ("by_id", "version")

    def __init__(self) -> None:
        self.by_id: dict[StreamId, S] = {}
        """Read as it is (the drain looks streams up in it); changed only here."""
        self.version = 0
        """A new int at every change: compared by identity, as the drain does."""

    def put(self, stream: StreamId, sockets: S) -> None:
        self.by_id[stream] = sockets
        self.version += 1

    def pop(self, stream: StreamId) -> S | None:
        sockets = self.by_id.pop(stream, None)
        if sockets is not None:
            self.version += 1
        return sockets

    def clear(self) -> None:
        self.by_id.clear()
        self.version += 1

    def get(self, stream: StreamId) -> S | None:
        return self.by_id.get(stream)

    def values(self) -> Iterable[S]:
        return self.by_id.values()
