"""The runs of the log's rows that become its chunks (storage/log_chunks.py): each stream and
epoch apart, cut where a chunk would grow past its bounds."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, groupby
from typing import Any, TypeVar

from kvscope.storage._row_streams import by_stream, fields_by_stream
from kvscope.storage._run_bounds import run_bounds
from kvscope.storage.rows import LogRow

_T = TypeVar("_T")

MAX_CHUNK_BATCHES = 2000
MAX_CHUNK_RAW_BYTES = 2 << 20
"""Bounds on a chunk: reading one batch (`kvscope dump --seq`, resume) unpacks its chunk."""
MAX_CHUNK_SPAN_S = 10.0
"""Engine seconds between a chunk's earliest and latest batch, at most."""
_LOG_FIELDS = 6
"""A `LogRow`'s: stream, epoch, seq, ts, receive time, payload."""


def split(rows: Sequence[LogRow]) -> list[Sequence[LogRow]]:
    """The runs of `rows` that `pack` makes chunks of."""
    if not rows:
        return []
    rows = by_stream(_listed(rows))
    # Already grouped: the columns are a plain transpose (this is not the writer's path).
    streams, epochs, _, ts, _, payloads = map(list, zip(*rows, strict=True))
    return [rows[start:end] for start, end in bounds(streams, epochs, ts, payloads)]


def columns_by_stream(rows: Sequence[LogRow]) -> list[list[Any]]:
    """The rows' fields, a list each, each stream's rows together (in the order applied, the
    streams in the order they first come), read once in C (storage/_row_streams.pyx).

    A fleet's transaction interleaves its streams batch by batch, and a chunk holds one
    stream's run: left interleaved, every batch would be a chunk of its own. `zip(*rows)` would
    make an iterator per row, and with them collections, while the writer holds the GIL."""
    return fields_by_stream(_listed(rows), _LOG_FIELDS)


def _listed(values: Sequence[_T]) -> list[_T]:
    """`values` as a list: itself where it is one (the writer's columns are: no copy a row)."""
    return values if type(values) is list else list(values)


def bounds(
    streams: Sequence[Any], epochs: Sequence[int], ts: Sequence[float], payloads: Sequence[bytes]
) -> list[tuple[int, int]]:
    """[start, end) of each run: a new one at a stream or epoch change, and before one would
    grow past its bounds (a run holds at least one batch, however large). Cut in C
    (storage/_run_bounds.pyx) but where a stamp is NaN."""
    found = run_bounds(
        _listed(streams),
        _listed(epochs),
        _listed(ts),
        _listed(payloads),
        MAX_CHUNK_BATCHES,
        MAX_CHUNK_RAW_BYTES,
        MAX_CHUNK_SPAN_S,
    )
    return _bounds_in_python(streams, epochs, ts, payloads) if found is None else found


def _bounds_in_python(
    streams: Sequence[Any], epochs: Sequence[int], ts: Sequence[float], payloads: Sequence[bytes]
) -> list[tuple[int, int]]:
    """`bounds`, the same cuts made in Python (where a stamp is NaN, for `sorted`'s order)."""
    n = len(ts)
    before = list(accumulate(map(len, payloads), initial=0))  # bytes before each row
    stamps = list(ts)
    if streams.count(streams[0]) == n and epochs.count(epochs[0]) == n:
        return _bounds_within(0, n, stamps, before)
    # A fleet's transaction, each stream's rows together (`columns_by_stream`): each stream and
    # epoch is cut as if it came alone, not row by row for all.
    cut: list[tuple[int, int]] = []
    start = 0
    for _, same in groupby(zip(streams, epochs, strict=True)):
        end = start + len(list(same))
        cut += _bounds_within(start, end, stamps, before)
        start = end
    return cut


def _bounds_within(
    start: int, stop: int, stamps: list[float], before: list[int]
) -> list[tuple[int, int]]:
    """`bounds` of rows [start, stop), all of one stream and epoch."""
    if stamps[start:stop] != sorted(stamps[start:stop]):
        return _bounds_row_by_row(start, stop, stamps, before)
    bounds = []
    while start < stop:  # the usual case, a chunk at a time: a clock ahead
        end = min(
            stop,
            start + MAX_CHUNK_BATCHES,
            bisect_right(before, before[start] + MAX_CHUNK_RAW_BYTES, start, stop + 1) - 1,
            bisect_right(stamps, stamps[start] + MAX_CHUNK_SPAN_S, start, stop),
        )
        end = max(end, start + 1)
        bounds.append((start, end))
        start = end
    return bounds


def _bounds_row_by_row(
    start: int, stop: int, stamps: list[float], before: list[int]
) -> list[tuple[int, int]]:
    bounds = []
    while start < stop:
        low = high = stamps[start]
        end = start + 1
        while end < min(stop, start + MAX_CHUNK_BATCHES):
            low, high = min(low, stamps[end]), max(high, stamps[end])
            if (
                before[end + 1] - before[start] > MAX_CHUNK_RAW_BYTES
                or high > low + MAX_CHUNK_SPAN_S
            ):
                break
            end += 1
        bounds.append((start, end))
        start = end
    return bounds
