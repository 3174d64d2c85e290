"""The one way state leaves the collector: an `EventSink`, told what each stream did in frozen
records, and the point a stream resumes from.

The collector calls its sink on the ingest thread, in each stream's order. A sink (the store's
writer, storage/writer.py) reads a map only through the `MapReader` it is handed and only during
that call: the live map changes with the next batch.

Most of what a store keeps follows from the batches (`applied`), but some of it is the map
*between* batches: a per-second rollup is the map at each second's end, a reset's recovery the
map at fixed offsets after it. The map at an engine-clock instant is the map just before the
first batch stamped past it (nothing changes between two batches), so the sink asks for it:
`instant` returns the span of stamps within which it needs no look, and the collector calls
`instant` again before the first batch stamped outside it, one comparison per batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec

from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.types import Batch, StreamId, TableKey

if TYPE_CHECKING:
    from array import array

    from kvscope.collector.block_table import TableStats
    from kvscope.collector.prefix_map import PrefixMap


class TableReader(Protocol):
    """One (medium, group) table, read only (`BlockTable` is one)."""

    @property
    def key(self) -> TableKey: ...
    @property
    def block_size(self) -> int: ...
    @property
    def hittable_count(self) -> int: ...
    @property
    def orphan_count(self) -> int: ...
    def __len__(self) -> int: ...
    def __contains__(self, block_hash: int) -> bool: ...
    def is_hittable(self, block_hash: int) -> bool: ...
    def hashes(self) -> frozenset[int]: ...
    def hash_array(self) -> array[int]: ...
    def hittable_hash_array(self) -> array[int]: ...
    def count_cached(self, hashes: array[int], hittable: bool = False) -> int: ...
    def counts(self) -> dict[int, int]: ...
    def to_state(self, interned_tokens: bool = False) -> dict[str, Any]:
        """What `collector/snapshot.py` encodes (`interned_tokens`: see `BlockTable`)."""
        ...

    def state_bytes(self) -> int:
        """About the bytes of `to_state`'s arrays."""
        ...


class MapReader(Protocol):
    """One publisher's map, read only (`PrefixMap` is one)."""

    @property
    def stream(self) -> StreamId: ...
    @property
    def tables(self) -> Mapping[TableKey, TableReader]: ...
    @property
    def signed_hashes(self) -> bool:
        """The publisher sends signed hashes (vLLM < 0.10.2): show them signed."""
        ...

    def totals(self) -> TableStats: ...
    def stats(self) -> dict[TableKey, TableStats]: ...


class Span(NamedTuple):
    """Engine-clock stamps `since <= ts < until`: batches stamped within need no `instant` call
    before them."""

    since: float
    until: float

    def within(self, other: Span) -> Span:
        """The stamps within both."""
        return Span(max(self.since, other.since), min(self.until, other.until))


EVERY_BATCH = Span(math.inf, -math.inf)
"""No stamp is within it: `instant` before every batch."""
NO_BATCH = Span(-math.inf, math.inf)
"""Every stamp is within it: no `instant` call."""


_ANY_BLOCK_SIZE = 2**63 - 1


class AppliedBatch(msgspec.Struct, frozen=True):
    """One batch applied to a stream's map, told after the map changed.

    A frozen Struct: one is built per batch on the ingest hot path, where a NamedTuple costs
    several times as much. Tracked by the garbage collector, as it holds the live map.
    """

    stream: StreamId
    epoch: int
    seq: int
    ts: float
    """The engine's clock (the batch's stamp)."""
    recv_ts: float
    """The collector's clock when the batch arrived."""
    payload: bytes
    """The batch as received (the store's log keeps it)."""
    decoded: Batch | None
    """The batch as decoded; None for one applied straight from its bytes (`batch` decodes it
    when asked: the store reads none of it)."""
    changes: Mapping[TableKey, Sequence[int]]
    """Blocks this batch stored and removed per table, `[stored, removed]` (a clear within the
    batch leaves both sides of it counted)."""
    gaps: int
    """Gaps in the stream's seqs found since its previous applied batch."""
    view: MapReader
    """The map after this batch (valid during the call only)."""

    @property
    def batch(self) -> Batch:
        """The batch as the stream's decoder makes it (decoded again on each call, if it was
        applied from its bytes: a batch the compiled decoder took within the stream's limits,
        which it takes the same under any greater block-size limit)."""
        decoded = self.decoded
        if decoded is None:
            decoded = decode_map_batch(self.payload, self.seq, _ANY_BLOCK_SIZE)
            assert decoded is not None, "a batch applied from its bytes is the decoder's"
        return decoded


class ClearReason(StrEnum):
    ALL_BLOCKS_CLEARED = "all_blocks_cleared"
    """The engine emptied its cache: a prefix-cache reset, sleep, a weight update."""
    RESTART = "restart"
    """The publisher started again (seq went backwards): a new engine has an empty cache."""


@dataclass(frozen=True, slots=True)
class ClearedMap:
    """What a map held when it was emptied: the "before" of a reset."""

    stream: StreamId
    epoch: int
    reason: ClearReason
    seq: int
    """The batch carrying the clear (for a restart: the first batch of the new epoch)."""
    ts: float
    tables: Mapping[TableKey, TableReader]
    """The emptied tables themselves: no longer the map's, and never changed again."""
    degraded: bool
    """Whether the map was known to be incomplete when it was emptied."""
    recv_ts: float | None = None
    """The collector's wall clock when the clear arrived (the engine's `ts` may be another
    clock: a lab's simulated time, or a skewed host)."""
    signed_hashes: bool = False
    """Whether the publisher sends its hashes as signed ints (SGLang): how they are shown."""


class DegradedStep(StrEnum):
    OPENED = "opened"
    WIDENED = "widened"
    """More seqs found missing while it was open (`to_seq` grew)."""
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class DegradedChange:
    """A degraded interval (the map known to be incomplete) as it stands after it opened,
    widened or closed. The same interval keeps its `since` and `from_seq`."""

    step: DegradedStep
    stream: StreamId
    epoch: int
    reason: str
    from_seq: int
    """First seq whose changes are missing (or the seq at which the stream was joined)."""
    to_seq: int | None
    """Last missing seq, if known."""
    since: float
    """Receive time at which it was noticed."""
    cleared_at_seq: int | None = None
    """The seq of the batch whose clear made the map known again (None: it ended with its
    epoch, at a restart, or is still open)."""
    cleared_at: float | None = None
    """When it closed (None: still open)."""


@dataclass(frozen=True, slots=True)
class ConnectionChange:
    stream: StreamId
    connected: bool
    """Up (its first peer connected) or down (its last one left)."""
    ts: float
    """The collector's wall clock."""


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a stream starts when its map was kept elsewhere (a store, after a crash): the map
    after batch `last_seq`. The stream's first replay asks from `last_seq` and checks that batch
    against `last_payload`, so a publisher that restarted meanwhile is noticed."""

    stream: StreamId
    map: PrefixMap
    """Handed over: the stream applies its batches to it from here on."""
    epoch: int
    last_seq: int
    last_payload: bytes
    degraded: tuple[DegradedChange, ...] = ()
    """The degraded intervals still open at `last_seq` (as they `OPENED`), one per cause:
    closing them later closes the same intervals."""


class EventSink(Protocol):
    """What the collector tells about its streams (on the ingest thread, in stream order)."""

    def applied(self, batch: AppliedBatch) -> None:
        """After each batch changed the map."""
        ...

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        """Just before a batch stamped `ts` changes the map: `view` is the map at every instant
        since the stream's previous batch. Called before a stream's first batch, its first batch
        after each clear or resume, and its first batch stamped outside the span the last call
        returned; it may be called more often (several sinks share one span), so it acts only on
        what `ts` shows."""
        ...

    def map_cleared(self, cleared: ClearedMap) -> None:
        """A map was emptied (an `AllBlocksCleared`, or a restart): what it held."""
        ...

    def degraded(self, change: DegradedChange) -> None:
        """A degraded interval opened, widened or closed."""
        ...

    def connection(self, change: ConnectionChange) -> None:
        """A stream's connection went up or down."""
        ...


class NullSink:
    """An `EventSink` that does nothing: subclass it and override what you need."""

    def applied(self, batch: AppliedBatch) -> None:
        return None

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        return NO_BATCH

    def map_cleared(self, cleared: ClearedMap) -> None:
        return None

    def degraded(self, change: DegradedChange) -> None:
        return None

    def connection(self, change: ConnectionChange) -> None:
        return None


class FanOut:
    """Several sinks as one, each told everything in the order given."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks

    def applied(self, batch: AppliedBatch) -> None:
        for sink in self.sinks:
            sink.applied(batch)

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        span = NO_BATCH
        for sink in self.sinks:
            span = span.within(sink.instant(stream, ts, view))
        return span

    def map_cleared(self, cleared: ClearedMap) -> None:
        for sink in self.sinks:
            sink.map_cleared(cleared)

    def degraded(self, change: DegradedChange) -> None:
        for sink in self.sinks:
            sink.degraded(change)

    def connection(self, change: ConnectionChange) -> None:
        for sink in self.sinks:
            sink.connection(change)
