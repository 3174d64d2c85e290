"""The batch log's rows: runs of one epoch's consecutive batches, compressed together.

A row per batch cost the writer a B-tree insert and a kilobyte of page writes for each one, the
largest part of the store's work. A chunk holds up to `MAX_CHUNK_BATCHES` batches (fewer, when
the writer's transaction holds fewer) as one zstd frame, so the log costs a few rows a second
and about a third of the bytes (token ids repeat across a chunk; alone they hardly compress).

Every batch stays exactly as received, with its seq, engine ts and receive time. A chunk also
spans at most `MAX_CHUNK_SPAN_S` of engine time, so that the chunks which may hold the batch
stamped last before an instant are found through two indexes, whatever the engine's clock did.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

import msgspec
import zstandard

from kvscope.storage.rows import LogRow

CHUNK_FORMAT = 1
"""The format `pack` writes."""
WRITABLE_FORMATS = (1,)
MAX_CHUNK_BATCHES = 2000
MAX_CHUNK_RAW_BYTES = 2 << 20
"""Bounds on a chunk: reading one batch (`kvscope dump --seq`, resume) unpacks its chunk."""
MAX_CHUNK_SPAN_S = 10.0
"""Engine seconds between a chunk's earliest and latest batch, at most."""
ZSTD_LEVEL = 1
"""Higher levels pack the log hardly smaller at a much lower speed (benchmarks/store.py)."""


class ChunkError(ValueError):
    """Bytes that are not a log chunk this version can read."""


class LoggedBatch(NamedTuple):
    """A NamedTuple: a rebuild makes one per batch it replays."""

    seq: int
    ts: float
    recv_ts: float
    payload: bytes


class ChunkRow(NamedTuple):
    """A chunk as it is stored: its bounds in columns (in the table's order), its batches packed
    in `data`."""

    stream: Any
    """The rows' stream (a `StreamId`), put as its id when written."""
    epoch: int
    first_seq: int
    last_seq: int
    min_ts: float
    max_ts: float
    batches: int
    raw_bytes: int
    data: bytes
    min_recv_ts: float
    max_recv_ts: float

    def values(self, stream_id: int) -> dict[str, Any]:
        """The row's columns, under the stream's id."""
        return dict(zip(COLUMNS, (stream_id, *self[1:]), strict=True))


COLUMNS = ("stream_id", *ChunkRow._fields[1:])


class Chunk:
    """An unpacked chunk: its batches by seq (ascending, as they were applied)."""

    __slots__ = ("seqs", "ts", "recv_ts", "payloads")

    def __init__(self, data: bytes) -> None:
        try:
            version, seqs, ts, recv_ts, payloads = msgspec.msgpack.decode(
                zstandard.ZstdDecompressor().decompress(data)
            )
        except (zstandard.ZstdError, msgspec.DecodeError, ValueError, TypeError) as exc:
            raise ChunkError(f"not a log chunk: {exc}") from exc
        if version != CHUNK_FORMAT:
            raise ChunkError(f"unknown log chunk format {version!r}")
        self.seqs = array("q", seqs)
        self.ts = array("d", ts)
        self.recv_ts = array("d", recv_ts)
        self.payloads: list[bytes] = payloads
        if not len(self.seqs) == len(self.ts) == len(self.recv_ts) == len(payloads):
            raise ChunkError("log chunk columns differ in length")

    def __len__(self) -> int:
        return len(self.seqs)

    def batch(self, i: int) -> LoggedBatch:
        return LoggedBatch(self.seqs[i], self.ts[i], self.recv_ts[i], self.payloads[i])

    def at_or_before(self, seq: int) -> LoggedBatch | None:
        """The last batch with a seq <= `seq`."""
        i = bisect_right(self.seqs, seq)
        return self.batch(i - 1) if i else None

    def between(self, after: int, upto: int) -> Iterator[LoggedBatch]:
        """Batches with after < seq <= upto, in order."""
        for i in range(*self._range(after, upto)):
            yield self.batch(i)

    def payloads_between(self, after: int, upto: int) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of the same batches."""
        start, end = self._range(after, upto)
        return zip(self.seqs[start:end], self.payloads[start:end], strict=True)

    def _range(self, after: int, upto: int) -> tuple[int, int]:
        return bisect_right(self.seqs, after), bisect_right(self.seqs, upto)


def pack(rows: Sequence[LogRow], fmt: int = CHUNK_FORMAT) -> list[ChunkRow]:
    """`rows` (in the order applied) as chunks of format `fmt`, compressed.

    The writer thread holds the GIL for all of this but the compression, and the ingest thread
    waits meanwhile: rows are handled as columns (`zip`, `array`, `accumulate`, `bisect` run in
    C), and all chunks are compressed in one call, which lets the GIL go once rather than once
    per chunk (taking it back from a busy ingest thread can cost a whole switch interval).
    """
    if fmt not in WRITABLE_FORMATS:
        raise ValueError(f"log chunk format {fmt} is not one this version writes")
    if not rows:
        return []
    streams, epochs, seqs, ts, recv_ts, payloads = zip(*_by_stream(rows), strict=True)
    made = []
    for start, end in _bounds(streams, epochs, ts, payloads):
        run_seqs, run_ts = array("q", seqs[start:end]), array("d", ts[start:end])
        run_recv = array("d", recv_ts[start:end])
        raw = msgspec.msgpack.encode(
            (
                CHUNK_FORMAT,
                run_seqs.tobytes(),
                run_ts.tobytes(),
                run_recv.tobytes(),
                payloads[start:end],
            )
        )
        made.append(
            ChunkRow(
                streams[start],
                epochs[start],
                run_seqs[0],
                run_seqs[-1],
                min(run_ts),
                max(run_ts),
                end - start,
                len(raw),
                raw,
                min(run_recv),
                max(run_recv),
            )
        )
    # A compressor object must not be shared between threads: one per call.
    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).multi_compress_to_buffer(
        [chunk.data for chunk in made]
    )
    return [chunk._replace(data=packed[i].tobytes()) for i, chunk in enumerate(made)]


def split(rows: Sequence[LogRow]) -> list[Sequence[LogRow]]:
    """The runs of `rows` that `pack` makes chunks of."""
    if not rows:
        return []
    rows = _by_stream(rows)
    streams, epochs, _, ts, _, payloads = zip(*rows, strict=True)
    return [rows[start:end] for start, end in _bounds(streams, epochs, ts, payloads)]


def _by_stream(rows: Sequence[LogRow]) -> Sequence[LogRow]:
    """Each stream's rows together, in the order applied. A fleet's transaction interleaves its
    streams batch by batch, and a chunk holds one stream's run: left interleaved, every batch
    would be a chunk of its own."""
    first = rows[0][0]
    if all(row[0] == first for row in rows):
        return rows
    grouped: dict[Any, list[LogRow]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    return [row for group in grouped.values() for row in group]


def _bounds(
    streams: Sequence[Any], epochs: Sequence[int], ts: Sequence[float], payloads: Sequence[bytes]
) -> list[tuple[int, int]]:
    """[start, end) of each run: a new one at a stream or epoch change, and before one would
    grow past its bounds (a run holds at least one batch, however large)."""
    n = len(ts)
    before = list(accumulate(map(len, payloads), initial=0))  # bytes before each row
    stamps = list(ts)
    if streams.count(streams[0]) != n or epochs.count(epochs[0]) != n or stamps != sorted(stamps):
        return _bounds_row_by_row(streams, epochs, stamps, before)
    bounds = []
    start = 0
    while start < n:  # the usual case, a chunk at a time: one stream and epoch, a clock ahead
        end = min(
            n,
            start + MAX_CHUNK_BATCHES,
            bisect_right(before, before[start] + MAX_CHUNK_RAW_BYTES) - 1,
            bisect_right(stamps, stamps[start] + MAX_CHUNK_SPAN_S),
        )
        end = max(end, start + 1)
        bounds.append((start, end))
        start = end
    return bounds


def _bounds_row_by_row(
    streams: Sequence[Any], epochs: Sequence[int], stamps: list[float], before: list[int]
) -> list[tuple[int, int]]:
    bounds = []
    start, n = 0, len(stamps)
    while start < n:
        low = high = stamps[start]
        end = start + 1
        while end < min(n, start + MAX_CHUNK_BATCHES):
            low, high = min(low, stamps[end]), max(high, stamps[end])
            if (
                before[end + 1] - before[start] > MAX_CHUNK_RAW_BYTES
                or high > low + MAX_CHUNK_SPAN_S
                or epochs[end] != epochs[start]
                or streams[end] != streams[start]
            ):
                break
            end += 1
        bounds.append((start, end))
        start = end
    return bounds
