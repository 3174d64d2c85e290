"""The collector's vocabulary: identifiers and the domain events that wire decoding produces.

Nothing here knows about msgpack or sockets. Past `wire.BatchDecoder`, every block hash is an
unsigned 64-bit int (vLLM's int form), whatever form it travelled in (bytes reduced to their low
64 bits). The events are msgspec
Structs only because one is built per event on the ingest hot path, where a dataclass costs more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import msgspec

HASH_MASK = (1 << 64) - 1

MEDIUM_GPU = "GPU"


class StreamId(msgspec.Struct, frozen=True, gc=False, cache_hash=True):
    """One publisher: a replica's data-parallel rank. Each has its own seq counter and map.

    A frozen Struct like TableKey: the store's hooks look their state up by it once per batch,
    and a fleet's drain its stream once per message; its hash is kept (`cache_hash`).
    """

    replica: str
    rank: int

    def __str__(self) -> str:
        return f"{self.replica}/dp{self.rank}"


class TableKey(msgspec.Struct, frozen=True, gc=False, cache_hash=True):
    """The part of a block's identity besides its hash: vLLM keeps tiers and KV groups apart.

    A frozen Struct: it keys the tables and is hashed once per event, which a Struct does in C;
    its hash is kept (`cache_hash`: keys are interned, one per table).
    Equal only to another TableKey (unlike a tuple); ordered by nothing (sort by its fields).
    """

    medium: str
    group: int


class BlocksStored(msgspec.Struct, gc=False):
    """A chain of newly cached blocks of one request: block i's parent is block i-1."""

    hashes: list[int]
    parent: int | None
    token_ids: Sequence[int]
    """An `array("I")` from the decoders (what the block table keeps), or a list."""
    block_size: int
    table: TableKey
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    raw_hashes: list[bytes] | None = None
    """The hashes as sent, when they travelled as bytes (kept for display)."""
    raw_parent: bytes | None = None
    signed_hashes: bool = False
    """Some hash arrived as a negative int: the publisher uses signed hashes (vLLM < 0.10.2)."""


class BlocksRemoved(msgspec.Struct, gc=False):
    """One physical copy of each hash left the cache (count down by one)."""

    hashes: list[int]
    table: TableKey


@final  # the map tells it by `type(event) is AllCleared`
class AllCleared(msgspec.Struct, gc=False):
    """Every tier and group of this publisher was emptied."""


KVEvent = BlocksStored | BlocksRemoved | AllCleared


class Batch(msgspec.Struct, gc=False):
    """One decoded `KVEventBatch` as it arrived on a stream."""

    seq: int
    ts: float
    rank: int | None
    events: list[KVEvent]
    dropped_events: int = 0
    """Events of this batch of a type the decoder does not know (skipped)."""
    payload_bytes: int = 0
    """The size of the payload it was decoded from (0: built otherwise). It bounds what the
    batch can add to a map, which spares most batches a pass to check the map's limits."""
