"""A msgpack writer with no opinions: it writes what a hostile publisher could send.

`pack` encodes None, bools, ints in [-2**63, 2**64), floats (float64), str, bytes, lists,
tuples and dicts (keys of any type, in order), plus `Raw` (bytes written as they are: a lying
header, invalid UTF-8) and `Ext`.
"""

from __future__ import annotations

import struct

import msgspec


class Raw:
    """Bytes written into the output as they are. (Plain classes: msgspec would encode a
    dataclass as a map, and must refuse these so that `pack` writes them itself.)"""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class Ext:
    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        self.code, self.data = code, data


class Pairs:
    """A map written from (key, value) pairs: duplicate keys allowed."""

    __slots__ = ("items",)

    def __init__(self, items: tuple[tuple[object, object], ...]) -> None:
        self.items = items


def _sized(n: int, fix: int | None, fix_max: int, codes: tuple[int, int, int]) -> bytes:
    if fix is not None and n <= fix_max:
        return bytes([fix | n])
    if n < 1 << 8 and codes[0]:
        return bytes([codes[0], n])
    if n < 1 << 16:
        return bytes([codes[1]]) + n.to_bytes(2, "big")
    return bytes([codes[2]]) + n.to_bytes(4, "big")


def array_header(n: int) -> bytes:
    return _sized(n, 0x90, 15, (0, 0xDC, 0xDD))


def map_header(n: int) -> bytes:
    return _sized(n, 0x80, 15, (0, 0xDE, 0xDF))


def str_header(n: int) -> bytes:
    return _sized(n, 0xA0, 31, (0xD9, 0xDA, 0xDB))


def bin_header(n: int) -> bytes:
    return _sized(n, None, 0, (0xC4, 0xC5, 0xC6))


def float32(value: float) -> bytes:
    return b"\xca" + struct.pack(">f", value)


def pack_int(v: int) -> bytes:
    if 0 <= v <= 0x7F:
        return bytes([v])
    if -32 <= v < 0:
        return struct.pack(">b", v)
    if v >= 0:
        for code, fmt, bound in ((0xCC, ">B", 8), (0xCD, ">H", 16), (0xCE, ">I", 32)):
            if v < 1 << bound:
                return bytes([code]) + struct.pack(fmt, v)
        return b"\xcf" + struct.pack(">Q", v)  # struct refuses what msgpack cannot hold
    for code, fmt, bound in ((0xD0, ">b", 7), (0xD1, ">h", 15), (0xD2, ">i", 31)):
        if v >= -(1 << bound):
            return bytes([code]) + struct.pack(fmt, v)
    return b"\xd3" + struct.pack(">q", v)


def pack(value: object) -> bytes:
    try:  # msgspec writes the same bytes, faster, for what holds no Raw, Ext or Pairs
        return msgspec.msgpack.encode(value)
    except (TypeError, OverflowError):
        pass
    out: list[bytes] = []
    _pack(value, out)
    return b"".join(out)


def _pack(v: object, out: list[bytes]) -> None:
    if v is None:
        out.append(b"\xc0")
    elif v is True:
        out.append(b"\xc3")
    elif v is False:
        out.append(b"\xc2")
    elif type(v) is int:
        out.append(pack_int(v))
    elif type(v) is float:
        out.append(b"\xcb" + struct.pack(">d", v))
    elif type(v) is str:
        data = v.encode("utf-8", "surrogatepass")
        out.append(str_header(len(data)) + data)
    elif type(v) is bytes:
        out.append(bin_header(len(v)) + v)
    elif type(v) is list or type(v) is tuple:
        out.append(array_header(len(v)))
        for item in v:
            _pack(item, out)
    elif isinstance(v, dict | Pairs):
        pairs = v.items if isinstance(v, Pairs) else tuple(v.items())
        out.append(map_header(len(pairs)))
        for key, item in pairs:
            _pack(key, out)
            _pack(item, out)
    elif type(v) is Raw:
        out.append(v.data)
    elif type(v) is Ext:
        n = len(v.data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(n)
        head = bytes([fixed]) if fixed else b"\xc7" + n.to_bytes(1, "big")
        out.append(head + struct.pack(">b", v.code) + v.data)
    else:
        raise TypeError(f"cannot pack a {type(v).__name__}")
