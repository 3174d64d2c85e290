"""What the ingest thread hands the store's writer thread: one small object per row to write.

Not frozen: frozen dataclasses are slow to build.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.collector.types import StreamId
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
    before: bytes
    """The emptied tables copied (`copy_tables`)."""
    packed_before: bytes = b""
    """`before` encoded (`encode_copy`), by the writer thread."""


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

# Batches, rollups and checkpoints may be dropped when the queue is full; the rest never are.
