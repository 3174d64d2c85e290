"""For the compiled decoder's tests: compare its Batch with the slow path's, and write msgpack
at any valid width (msgspec always writes the smallest)."""

from __future__ import annotations

import random
import struct
from array import array
from typing import Any

import msgspec
from msgspec.msgpack import Ext

from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.limits import IngestLimits
from kvscope.collector.types import AllCleared, Batch, BlocksRemoved, BlocksStored
from kvscope.collector.wire import BatchDecoder

MAX_BS = 64
"""The block size limit the tests decode with (small, so that generated batches cross it)."""


def reference(payload: bytes, seq: int) -> Batch:
    """What the slow path makes of a payload (it raises for one it refuses)."""
    return BatchDecoder(IngestLimits(max_block_size=MAX_BS))._decode_slow(payload, seq)


def assert_same(fast: Batch, slow: Batch) -> None:
    assert (fast.seq, fast.rank, fast.dropped_events) == (slow.seq, slow.rank, slow.dropped_events)
    assert fast.payload_bytes == slow.payload_bytes
    assert type(fast.rank) is type(slow.rank)
    assert struct.pack("<d", fast.ts) == struct.pack("<d", slow.ts)  # NaN too
    assert len(fast.events) == len(slow.events)
    for f, s in zip(fast.events, slow.events, strict=True):
        assert type(f) is type(s)
        if type(f) is BlocksStored:
            assert type(s) is BlocksStored
            assert type(f.token_ids) is array and f.token_ids.typecode == "I"
            assert list(f.token_ids) == list(s.token_ids)
            assert f.table == s.table
            assert msgspec.structs.replace(f, token_ids=[]) == msgspec.structs.replace(
                s, token_ids=[]
            )
        elif type(f) is BlocksRemoved:
            assert type(s) is BlocksRemoved
            assert f.table == s.table
            assert f.hashes == s.hashes
        else:
            assert f == s == AllCleared()


def check(payload: bytes, seq: int = 3) -> Batch | None:
    """The fast result; when it is a Batch, the slow path must accept the payload and agree."""
    fast = decode_map_batch(payload, seq, MAX_BS)
    if fast is not None:
        assert_same(fast, reference(payload, seq))
    return fast


# --- a msgpack writer that picks any valid width (msgspec always writes the smallest) ---------
def _sized(
    n: int, fix: int | None, fix_max: int, wide: dict[int, str], rnd: random.Random
) -> bytes:
    """A header for `n` items: the fix form (`fix | n`) or a wide one (code: length format)."""
    options = [bytes([fix | n])] if fix is not None and n <= fix_max else []
    for code, fmt in wide.items():
        if n < 1 << (8 * struct.calcsize(fmt)):
            options.append(bytes([code]) + struct.pack(fmt, n))
    return rnd.choice(options)


def ints(v: int) -> list[bytes]:
    """`v` at each width msgpack has for it."""
    out = []
    if 0 <= v < 128 or -32 <= v < 0:
        out.append(struct.pack(">b" if v < 0 else ">B", v))
    for code, fmt in zip(range(0xCC, 0xD0), "BHIQ", strict=True):
        if 0 <= v < 1 << (8 * struct.calcsize(fmt)):
            out.append(bytes([code]) + struct.pack(">" + fmt, v))
    for code, fmt in zip(range(0xD0, 0xD4), "bhiq", strict=True):
        bits = 8 * struct.calcsize(fmt) - 1
        if -(1 << bits) <= v < 1 << bits:
            out.append(bytes([code]) + struct.pack(">" + fmt, v))
    return out


def fixstr(data: bytes) -> bytes:
    return bytes([0xA0 | len(data)]) + data


def event_map(items: list[tuple[bytes, bytes | None]], rnd: random.Random) -> bytes:
    """An event's map of `items` (a key, its value already written; None: no such key), its
    keys as fixstr, in a random order."""
    present = [(key, value) for key, value in items if value is not None]
    rnd.shuffle(present)
    return bytes([0x80 | len(present)]) + b"".join(fixstr(k) + v for k, v in present)


def pack(value: Any, rnd: random.Random) -> bytes:
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if type(value) is int:
        return rnd.choice(ints(value))
    if type(value) is float:
        f32 = struct.pack(">f", value) if abs(value) < 3e38 or value != value else b""
        if f32 and value == value and struct.unpack(">f", f32)[0] == value and rnd.random() < 0.5:
            return b"\xca" + f32
        return b"\xcb" + struct.pack(">d", value)
    if type(value) is str:
        data = value.encode()
        return _sized(len(data), 0xA0, 31, {0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}, rnd) + data
    if type(value) is bytes:
        return _sized(len(value), None, 0, {0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}, rnd) + value
    if type(value) is Ext:
        data, code = bytes(value.data), struct.pack(">b", value.code)
        size = len(data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if size in fixed and rnd.random() < 0.5:
            return bytes([fixed[size]]) + code + data
        return _sized(size, None, 0, {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}, rnd) + code + data
    if type(value) is list:
        head = _sized(len(value), 0x90, 15, {0xDC: ">H", 0xDD: ">I"}, rnd)
        return head + b"".join(pack(v, rnd) for v in value)
    assert type(value) is dict
    head = _sized(len(value), 0x80, 15, {0xDE: ">H", 0xDF: ">I"}, rnd)
    return head + b"".join(pack(k, rnd) + pack(v, rnd) for k, v in value.items())
