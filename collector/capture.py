"""Recorded streams: the capture format of `kvscope/data/FORMAT.md`.

A capture is a gzip of msgpack records, one per message a SUB socket received:
`[recv_ts: float, topic: bin, seq: bin (8 bytes, big-endian), payload: bin]`.
"""

from __future__ import annotations

import gzip
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


def read_capture(path: str | Path) -> Iterator[CaptureRecord]:
    decoder = msgspec.msgpack.Decoder(tuple[float, bytes, bytes, bytes])
    with gzip.open(path, "rb") as f:
        data = f.read()
    # Records are concatenated msgpack values: decode them one after another.
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        size = _next_value_size(view, offset)
        recv_ts, topic, seq, payload = decoder.decode(view[offset : offset + size])
        offset += size
        yield CaptureRecord(recv_ts, topic, seq, payload)


def write_capture(path: str | Path, records: Iterable[CaptureRecord]) -> int:
    encoder = msgspec.msgpack.Encoder()
    n = 0
    with gzip.open(path, "wb") as f:
        for r in records:
            f.write(encoder.encode((r.recv_ts, r.topic, r.seq_frame, r.payload)))
            n += 1
    return n


def _next_value_size(view: memoryview, offset: int) -> int:
    """Byte length of the 4-element record array starting at `offset`."""
    pos = offset
    if view[pos] != 0x94:
        raise ValueError(f"capture record at byte {offset} is not a 4-element array")
    pos += 1
    # recv_ts: float 64 (0xcb) or 32 (0xca), or an int
    head = view[pos]
    if head == 0xCB:
        pos += 9
    elif head == 0xCA:
        pos += 5
    elif head <= 0x7F:
        pos += 1
    elif head in (0xCC, 0xCD, 0xCE, 0xCF):
        pos += 1 + (1 << (head - 0xCC))
    else:
        raise ValueError(f"capture record at byte {offset}: recv_ts is not a number")
    for _ in range(3):
        head = view[pos]
        if head == 0xC4:
            pos += 2 + view[pos + 1]
        elif head == 0xC5:
            pos += 3 + int.from_bytes(view[pos + 1 : pos + 3], "big")
        elif head == 0xC6:
            pos += 5 + int.from_bytes(view[pos + 1 : pos + 5], "big")
        else:
            raise ValueError(f"capture record at byte {offset}: expected a bin field")
    return pos - offset
