"""Recorded streams: the capture format of `kvscope/data/FORMAT.md`.

A capture is a gzip of msgpack records, one per message a SUB socket received:
`[recv_ts: float, topic: bin, seq: bin (8 bytes, big-endian), payload: bin]`. A capture cut
short or corrupt raises `CaptureError` (a ValueError) after the records before the damage.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec


@dataclass(frozen=True, slots=True)
class CaptureRecord:
    recv_ts: float
    topic: bytes
    seq_frame: bytes
    payload: bytes

    @property
    def seq(self) -> int:
        return int.from_bytes(self.seq_frame, "big")

    @property
    def frames(self) -> list[bytes]:
        return [self.topic, self.seq_frame, self.payload]


class CaptureError(ValueError):
    """A capture that ends inside a record or holds something that is no record.

    Raised after the records before it were yielded: `records` of them, the bad one starting at
    byte `offset` of the uncompressed stream."""

    def __init__(self, path: str | Path, records: int, offset: int, why: str) -> None:
        super().__init__(f"{path}: record {records} (byte {offset}): {why}")
        self.records = records
        self.offset = offset


def read_capture(path: str | Path) -> Iterator[CaptureRecord]:
    """The records in order; a truncated or corrupt capture raises `CaptureError` where its
    records stop (those before it are yielded first)."""
    decoder = msgspec.msgpack.Decoder(tuple[float, bytes, bytes, bytes])
    data, gzip_error = _decompressed(path)
    # Records are concatenated msgpack values: decode them one after another.
    view = memoryview(data)
    offset = records = 0
    while offset < len(view):
        try:
            size = _next_value_size(view, offset)
            recv_ts, topic, seq, payload = decoder.decode(view[offset : offset + size])
        except _Truncated:
            why = f"cut short ({gzip_error})" if gzip_error else "cut short"
            raise CaptureError(path, records, offset, why) from None
        except (ValueError, msgspec.DecodeError) as exc:  # DecodeError: a field of a wrong type
            raise CaptureError(path, records, offset, str(exc)) from None
        offset += size
        records += 1
        yield CaptureRecord(recv_ts, topic, seq, payload)
    if gzip_error:
        raise CaptureError(path, records, offset, gzip_error)


def _decompressed(path: str | Path) -> tuple[bytes, str | None]:
    """The capture's bytes, as far as they decompress, and why they stop short (or None)."""
    chunks = []
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read1(1 << 20):  # read1: the last chunk before a cut is kept
                chunks.append(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        return b"".join(chunks), f"gzip stream broken: {exc}"
    return b"".join(chunks), None


def write_capture(path: str | Path, records: Iterable[CaptureRecord]) -> int:
    encoder = msgspec.msgpack.Encoder()
    n = 0
    with gzip.open(path, "wb") as f:
        for r in records:
            f.write(encoder.encode((r.recv_ts, r.topic, r.seq_frame, r.payload)))
            n += 1
    return n


class _Truncated(Exception):
    """The record goes on past the end of the data."""


def _next_value_size(view: memoryview, offset: int) -> int:
    """Byte length of the 4-element record array starting at `offset`."""
    end = len(view)

    def at(pos: int) -> int:
        if pos >= end:
            raise _Truncated
        return view[pos]

    def number(pos: int, width: int) -> int:
        if pos + width > end:
            raise _Truncated
        return int.from_bytes(view[pos : pos + width], "big")

    if view[offset] != 0x94:
        raise ValueError("not a 4-element array")
    pos = offset + 1
    # recv_ts: float 64 (0xcb) or 32 (0xca), or an int
    head = at(pos)
    if head == 0xCB:
        pos += 9
    elif head == 0xCA:
        pos += 5
    elif head <= 0x7F:
        pos += 1
    elif head in (0xCC, 0xCD, 0xCE, 0xCF):
        pos += 1 + (1 << (head - 0xCC))
    else:
        raise ValueError("recv_ts is not a number")
    for _ in range(3):
        head = at(pos)
        if head == 0xC4:
            pos += 2 + number(pos + 1, 1)
        elif head == 0xC5:
            pos += 3 + number(pos + 1, 2)
        elif head == 0xC6:
            pos += 5 + number(pos + 1, 4)
        else:
            raise ValueError("expected a bin field")
    if pos > end:
        raise _Truncated
    return pos - offset
