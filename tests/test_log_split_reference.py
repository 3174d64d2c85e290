"""The log's split (storage/_log_walk.pxd, format 3's columns without granules) gives, byte for
byte, the columns of a plain reading of its rules in Python: the walk's shortcuts (a token the
skeleton keeps as it lies stepped over in one load) change how it reads, never what it writes.
The same streams' columns come back through `join` and are checked by `joins_back`."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kvscope.storage._log_columns import join, joins_back, split
from tests.test_log_columns import ANY_MSGPACK, SETTINGS
from tests.wire_fast_strategies import batch, encoded

MARK = 0xC1


def _span(b: int) -> int:
    """Bytes of a token kept whole by its first byte, 0 for the others (format 3's reading)."""
    if b <= 0x8F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
        return 1
    if 0xA0 <= b <= 0xBF:
        return 1 + (b & 0x1F)
    return {0xCA: 5, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD4: 3, 0xD5: 4,
            0xD6: 6, 0xD7: 10, 0xD8: 18}.get(b, 0)  # fmt: skip


def _token(p: bytes, pos: int) -> tuple[int, int]:
    """(bytes of the token at `pos` kept together, an array's items else -1); -1 bytes if cut
    short or not msgpack."""
    b, left = p[pos], len(p) - pos
    n = _span(b)
    if n:
        return (n if n <= left else -1), -1
    items = -1
    if 0x90 <= b <= 0x9F:
        items, n = b & 0x0F, 1
    elif b == MARK:
        return -1, -1
    elif b <= 0xC9 or 0xD9 <= b <= 0xDB:
        w = 1 << ((b - 0xC4) if b <= 0xC6 else (b - 0xC7) if b <= 0xC9 else (b - 0xD9))
        if left < 1 + w:
            return -1, -1
        n = 1 + w + int.from_bytes(p[pos + 1 : pos + 1 + w], "big") + (0xC7 <= b <= 0xC9)
    else:
        w = 2 if b in (0xDC, 0xDE) else 4
        if left < 1 + w:
            return -1, -1
        if b <= 0xDD:
            items = int.from_bytes(p[pos + 1 : pos + 1 + w], "big")
        n = 1 + w
    return (n if n <= left else -1), items


def _ids_bytes(p: bytes, pos: int, count: int) -> int:
    """Bytes of `count` ints of at most 4 bytes from `pos`, else -1."""
    start = pos
    for _ in range(count):
        if pos >= len(p):
            return -1
        b = p[pos]
        w = 1 if b <= 0x7F or b >= 0xE0 else {0xCC: 2, 0xCD: 3, 0xCE: 5, 0xD0: 2, 0xD1: 3,
                                              0xD2: 5}.get(b, 0)  # fmt: skip
        if w == 0 or w > len(p) - pos:
            return -1
        pos += w
    return pos - start


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Columns:
    def __init__(self) -> None:
        self.cols = [bytearray() for _ in range(5)]  # skeleton, refs, literals, floats, tokens
        self.values: list[bytes] = []  # every hash, in order
        self.last: dict[bytes, int] = {}  # a hash's last occurrence; left by a payload undone
        self.prev = bytes(8)

    def hash_back(self, v: bytes) -> int:
        """Occurrences back `v` was last seen, 0 if not (an entry left by a payload kept
        verbatim since may name another value: the split checks it)."""
        was = self.last.get(v)
        back = len(self.values) - was if was is not None and was < len(self.values) else 0
        if back and self.values[was] != v:  # type: ignore[index]
            back = 0
        self.last[v] = len(self.values)
        self.values.append(v)
        return back

    def split_one(self, p: bytes) -> bool:
        skel, refs, lits, floats, toks = self.cols
        pos = run = 0
        while pos < len(p):
            b = p[pos]
            if b in (0xCF, 0xD3, 0xCB):
                if len(p) - pos < 9:
                    return False
                skel += p[run : pos + 1]
                body = p[pos + 1 : pos + 9]
                if b == 0xCB:
                    floats += bytes(x ^ y for x, y in zip(body, self.prev, strict=True))
                    self.prev = body
                else:
                    back = self.hash_back(body)
                    refs += _varint(back)
                    lits += body if back == 0 else b""
                pos = run = pos + 9
                continue
            n, items = _token(p, pos)
            if n < 0:
                return False
            pos += n
            if items > 0:
                n = _ids_bytes(p, pos, items)
                if n > 0:
                    skel += p[run:pos] + bytes([MARK])
                    toks += p[pos : pos + n]
                    pos = run = pos + n
        skel += p[run:pos]
        return True


def split_reference(payloads: list[bytes]) -> tuple[tuple[bytes, ...], int]:
    """`split(payloads)`, read plainly."""
    c, sizes, kept = _Columns(), bytearray(), 0
    for p in payloads:
        marks = [len(col) for col in c.cols]
        hashes, prev = len(c.values), c.prev
        if c.split_one(p):
            sizes += _varint((len(c.cols[0]) - marks[0]) << 1)
            continue
        for col, mark in zip(c.cols, marks, strict=True):
            del col[mark:]
        del c.values[hashes:]
        c.prev = prev
        c.cols[0] += p
        sizes += _varint((len(p) << 1) | 1)
        kept += 1
    return (bytes(sizes), *map(bytes, c.cols)), kept


def same_as_reference(payloads: list[bytes]) -> None:
    columns, kept = split(payloads)
    assert (columns, kept) == split_reference(payloads)
    assert join(len(payloads), *columns) == payloads
    assert joins_back(payloads, *columns)


@SETTINGS
@given(st.data())
def test_vllm_shaped_batches_split_as_read_plainly(data: st.DataObject) -> None:
    wild = data.draw(st.booleans())
    values = data.draw(st.lists(batch(wild), min_size=1, max_size=6))
    payloads = [encoded(data, v) for v in values]
    cut = data.draw(st.integers(0, max(len(p) for p in payloads)))
    same_as_reference(payloads + [p[:cut] for p in payloads] + payloads)


@SETTINGS
@given(
    st.lists(ANY_MSGPACK, min_size=1, max_size=6),
    st.lists(st.binary(max_size=30)),
    st.integers(0, 200),
)
def test_any_msgpack_and_any_bytes_split_as_read_plainly(
    values: list[object], junk: list[bytes], cut: int
) -> None:
    payloads = [msgspec.msgpack.encode(v) for v in values]
    same_as_reference(payloads + junk + [p[:cut] + p[cut + 1 :] for p in payloads] + payloads)


def test_every_first_byte_and_its_cut_short_forms() -> None:
    """Each first byte alone, with a little after it, and cut short: the walk's table of
    spans, bounds and the 8-byte ints' and floats' place all read as the rules say."""
    # A hash or a token run right after a few bytes: where the token before ends shows.
    after = [b"\x01" * k + b"\xcf" + bytes(range(1, 9)) + b"\x92\x05\x06" for k in range(20)]
    tails = [b"", b"\x01", b"\x01\x02\x03", bytes(range(1, 20)), bytes(40), *after]
    payloads = [bytes([b]) + tail for b in range(256) for tail in tails]
    same_as_reference(payloads)
    same_as_reference([b"\x93" + p for p in payloads[::7]])
