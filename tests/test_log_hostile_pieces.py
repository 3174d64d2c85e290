"""The packing of payloads put together from msgpack's pieces, whole and hostile: token runs
of every id width (ending at the payload's end, cut short, or followed by 0xC1), every first
byte with arbitrary bytes after it, length-prefixed bodies, array16/32 and map16/32 headers,
repeated hashes and floats. Whatever the bytes, a chunk joins back to exactly its payloads, and
the payloads kept verbatim are those the split cannot read, alone or in a chunk: the check (the
split's token-run records read in place of the ids walked again) must neither pass a chunk that
does not join back nor fail one that does (which would keep every payload verbatim)."""

from __future__ import annotations

import struct
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.storage import log_columns
from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_columns import join, joins_back
from kvscope.storage.log_columns import NO_GRANULES

SETTINGS = settings(max_examples=300, deadline=None)

ID_BYTES = st.one_of(
    st.integers(0, 0x7F).map(lambda v: bytes([v])),
    st.integers(0xE0, 0xFF).map(lambda v: bytes([v])),
    st.integers(0, 0xFF).map(lambda v: b"\xcc" + bytes([v])),
    st.integers(0, 0xFFFF).map(lambda v: b"\xcd" + struct.pack(">H", v)),
    st.integers(0, 0xFFFFFFFF).map(lambda v: b"\xce" + struct.pack(">I", v)),
    st.integers(-128, 127).map(lambda v: b"\xd0" + struct.pack(">b", v)),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: b"\xd1" + struct.pack(">h", v)),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: b"\xd2" + struct.pack(">i", v)),
)
"""One id as a token run holds it: msgpack ints of at most 4 bytes (`ids_bytes`' widths)."""


def array_header(n: int, kind: int) -> bytes:
    if kind == 0 and n <= 15:
        return bytes([0x90 | n])
    if kind <= 1 and n <= 0xFFFF:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


@st.composite
def token_run(draw: st.DrawFn) -> bytes:
    """An array of ids, its header saying as many, more (cut short) or fewer."""
    ids = draw(st.lists(ID_BYTES, min_size=1, max_size=40))
    said = len(ids) + draw(st.sampled_from([0, 0, 0, 1, -1, 1 << 20]))
    return array_header(max(said, 0), draw(st.integers(0, 2))) + b"".join(ids)


def length_body(first: int, width: int, extra: int) -> st.SearchStrategy[bytes]:
    """A bin/str/ext token: its length (true, or off by a little or a lot) and a body."""

    def made(body: bytes, off: int) -> bytes:
        n = max(0, min(len(body) + off, (1 << (8 * width)) - 1))
        return bytes([first]) + n.to_bytes(width, "big") + b"\x05" * extra + body

    return st.builds(made, st.binary(max_size=20), st.sampled_from([0, 0, 0, 1, -1, 1 << 30]))


GRANULES = (bytes(range(16)), b"\xcd\x01\x00" * 8 + b"\xd2\xff\xff\xff\xfe" * 8)
INDEX = GranuleIndex(b"".join(GRANULES))
"""A dictionary's granules, which the token runs below may hold (format 4's numbers)."""


@st.composite
def run_of_granules(draw: st.DrawFn) -> bytes:
    """A token run that starts with a granule of `INDEX`."""
    ids = draw(st.lists(ID_BYTES, max_size=20))
    return (
        array_header(16 + len(ids), draw(st.integers(0, 2)))
        + draw(st.sampled_from(GRANULES))
        + b"".join(ids)
    )


WIDTHS = (
    b"\x07",
    b"\xff",
    b"\xcc\x80",
    b"\xd1\x80\x00",
    b"\xce\x00\x01\x00\x00",
    b"\xd2\x80" + bytes(3),
)
"""An id of each width `ids_bytes` reads (1, 2, 3 and 5 bytes)."""


@st.composite
def one_width_run(draw: st.DrawFn) -> bytes:
    """A token run of ids of one width, its header saying as many or a few more: where ids
    are wide, the bytes left may be fewer than `ids_bytes` could read without a bound."""
    k = draw(st.integers(1, 30))
    said = k + draw(st.sampled_from([0, 1, 2, 7]))
    return array_header(said, draw(st.integers(0, 2))) + draw(st.sampled_from(WIDTHS)) * k


HASHES = st.sampled_from([b"\xcf" + bytes(range(k, k + 8)) for k in range(3)])
PIECE = st.one_of(
    run_of_granules(),
    one_width_run(),
    token_run(),
    token_run(),
    HASHES,
    st.binary(min_size=8, max_size=8).map(lambda b: b"\xd3" + b),
    st.sampled_from([b"\xcb" + bytes(8), b"\xcb" + b"\x3f\xf0" + bytes(6)]),
    st.builds(lambda b, rest: bytes([b]) + rest, st.integers(0, 255), st.binary(max_size=10)),
    length_body(0xC4, 1, 0),
    length_body(0xC5, 2, 0),
    length_body(0xC6, 4, 0),
    length_body(0xC7, 1, 1),
    length_body(0xC8, 2, 1),
    length_body(0xC9, 4, 1),
    length_body(0xD9, 1, 0),
    length_body(0xDA, 2, 0),
    length_body(0xDB, 4, 0),
    st.sampled_from([b"\xde\x00\x01", b"\xdf\x00\x00\x00\x02", b"\x81", b"\xc1", b"\xc0"]),
    st.sampled_from([b"\xd4\x01\x02", b"\xd8\x05" + bytes(16), b"\xa3abc", b"\xbf" + bytes(31)]),
)


@st.composite
def payload(draw: st.DrawFn) -> bytes:
    body = b"".join(draw(st.lists(PIECE, max_size=8)))
    cut = draw(st.sampled_from([None, None, None, 1, 2, 5]))
    return body if cut is None or cut >= len(body) else body[:-cut]


def packed(payloads: list[bytes], granules: GranuleIndex | None) -> tuple[list[bytes], int]:
    n = len(payloads)
    stamps = array("q", range(n)), array("d", [0.0] * n), array("d", [0.0] * n)
    frames, verbatim = log_columns.columns(*stamps, payloads, granules)
    return frames[1:8], verbatim


@SETTINGS
@given(st.lists(payload(), min_size=1, max_size=6))
def test_hostile_pieces_join_back_and_only_unreadable_ones_go_verbatim(
    payloads: list[bytes],
) -> None:
    for granules in (None, NO_GRANULES, INDEX):
        frames, verbatim = packed(payloads, granules)
        assert join(len(payloads), *frames, granules=granules) == payloads
        assert joins_back(payloads, *frames, granules=granules)
        alone = sum(packed([p], granules)[1] for p in payloads)
        assert verbatim == alone


def test_runs_that_say_more_ids_than_they_hold_read_no_byte_past_the_payload() -> None:
    """A token run whose header says more ids than the payload holds after it, at its end or
    before a few bytes: however many ids of whichever width, `ids_bytes` finds no run (each
    id then reads as an int), and none of the bytes after the payload's end goes in a column:
    the chunk it is in joins back with no payload kept verbatim."""
    good = b"\x93\x01\x02\x03"
    for id_bytes in WIDTHS:
        for k in range(1, 24):
            for extra in (0, 1, 2, 5):
                for trail in (b"", b"\xc0", b"\xc0" * 3, b"\xc0" * 4, b"\xc0" * 9):
                    p = array_header(k + extra, 1) + id_bytes * k + trail
                    payloads = [good, p, good]
                    for granules in (None, NO_GRANULES, INDEX):
                        frames, verbatim = packed(payloads, granules)
                        assert verbatim == 0, (p, granules)
                        assert join(3, *frames, granules=granules) == payloads
