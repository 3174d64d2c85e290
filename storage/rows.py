"""What the ingest thread hands the store's writer thread: one small object per row to write.

Not frozen: frozen dataclasses are slow to build.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvscope.collector.sink import TableReader
from kvscope.collector.snapshot import copy_tables, decode_copy, encode_tables
from kvscope.collector.types import StreamId, TableKey
from kvscope.storage.recovery import RecoveryPoint

LogRow = tuple[StreamId, int, int, float, float, bytes]
"""A batch for the log: (stream, epoch, seq, ts, recv_ts, payload). A plain tuple, one per batch:
the cheapest object to build on the ingest thread, and laid out as the log's columns."""


@dataclass(slots=True)
class EpochRow:
    stream: StreamId
    epoch: int
    recv_ts: float


@dataclass(slots=True)
class CheckpointRow:
    stream: StreamId
    epoch: int
    seq: int
    ts: float
    blocks: int
    snapshot: bytes
    """The map copied (`copy_map`): the ingest thread's part of a checkpoint."""
    packed: bytes = b""
    """The snapshot encoded from it, by the writer thread (storage/checkpoint_deltas.py)."""
    key_seq: int | None = None
    """For a delta checkpoint: the seq of the key it is read with."""


class BeforeMap:
    """A reset's `before` map: the emptied tables themselves, which a clear hands over and
    nothing changes again, read on the writer thread (encoded, and grouped by a prefix
    follower) without a copy made on the ingest thread. Pickled (a row spilled to disk) as
    their copy (`copy_tables`), so that a spilled row holds no tables."""

    __slots__ = ("tables", "signed", "nbytes")

    def __init__(self, tables: Mapping[TableKey, TableReader], signed: bool = False) -> None:
        self.tables = tables
        self.signed = signed
        """What the snapshot says of the hashes' sign."""
        self.nbytes = sum(table.state_bytes() for table in tables.values())
        """About what a copy of them takes (what the queue and the followers count)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_before_of_copy, (copy_tables(self.tables, self.signed),))


def _before_of_copy(copy: bytes) -> BeforeMap:
    tables, signed = decode_copy(copy)
    return BeforeMap(tables, signed)


def encode_before(before: BeforeMap) -> bytes:
    """The reset's `before` snapshot, compressed: the very bytes `encode_copy` makes of a copy
    of the tables (writer thread)."""
    return encode_tables(before.tables, before.signed)


@dataclass(slots=True)
class ResetRow:
    stream: StreamId
    key: tuple[int, int, str]
    """(epoch, seq, reason): the reset's identity in the store."""
    ts: float
    recv_ts: float | None
    degraded: bool
    before_blocks: int
    before_hittable: int
    before_orphans: int
    before_tokens: int
    before: BeforeMap
    """The emptied tables."""
    packed_before: bytes = b""
    """`before` encoded (`encode_before`), by the writer thread."""


@dataclass(slots=True)
class RecoveryRow:
    stream: StreamId
    key: tuple[int, int, str]
    points: tuple[RecoveryPoint, ...]
    t50_s: float | None
    t90_s: float | None
    peak_orphans: int
    until_ts: float
    complete: bool
    """Every offset of the window reached (else: the points so far)."""


@dataclass(slots=True)
class IntervalRow:
    stream: StreamId
    kind: str
    epoch: int | None
    from_ts: float
    to_ts: float | None
    from_seq: int | None
    to_seq: int | None
    detail: str


@dataclass(slots=True)
class RollupRow:
    stream: StreamId
    second: int
    medium: str
    group: int
    stored: int
    hittable: int
    orphans: int
    stores: int
    removes: int
    clears: int
    gaps: int


Row = LogRow | EpochRow | CheckpointRow | ResetRow | RecoveryRow | IntervalRow | RollupRow


def droppable(row: Row) -> bool:
    """Batches, rollups and checkpoints: the rows the queue may drop when it is full (the rest
    never are)."""
    return type(row) is tuple or type(row) is RollupRow or type(row) is CheckpointRow
