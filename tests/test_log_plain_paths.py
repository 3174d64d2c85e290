"""The packing checks that a chunk's columns join back (else keeps it verbatim) only where one of
its payloads took a path of the split other than its plain ones (storage/_log_walk.pxd's
`split_one`): a token the skeleton keeps whole by its first byte, an 8-byte int or float, an
array's or a map's header and an array's token run. A payload read any other way (a length and
a body: bin, ext, str8/16/32) or kept verbatim (0xC1, cut short) marks its chunk for the
check. So the plain paths are trusted, unchecked: here each of them, alone and
mixed with every other path, whatever its bytes, comes back exactly (or its payload verbatim),
with and without a granule index, with and without the content's note; and each other path
makes its chunk checked, as a plain reading of the split's rules says (`plain_only`)."""

from __future__ import annotations

import random
import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.capture import read_capture
from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_columns import checks_made, join, notes_read, pack_runs, split
from kvscope.storage.log_chunks import Chunk
from kvscope.storage.log_columns import NO_GRANULES
from kvscope.storage.log_dictionary import Dictionary, from_stored
from kvscope.storage.log_packer import LogPacker
from tests.conftest import capture_path
from tests.test_log_columns import ANY_MSGPACK
from tests.test_log_hostile_pieces import (
    INDEX,
    array_header,
    one_width_run,
    run_of_granules,
    token_run,
)
from tests.test_log_hostile_pieces import payload as hostile_payload
from tests.test_log_note_in_walk import batches
from tests.test_log_split_reference import _ids_bytes, _token
from tests.wire_fast_strategies import batch, encoded

SETTINGS = settings(max_examples=150, deadline=None)
INDEXES = (None, NO_GRANULES, INDEX)

PLAIN_FIRST = set(range(256)) - {0xC1, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xD9, 0xDA, 0xDB}
"""First bytes of the tokens the split reads by its plain paths: those the skeleton keeps whole
(`kvscope_column_span`'s), the 8-byte ints and float, and arrays' and maps' headers."""


def plain_only(p: bytes) -> bool:
    """Whether the split reads `p` whole by its plain paths alone (a plain reading of
    `split_one`: each token by its first byte, each array's ids as a token run where they
    are one)."""
    pos = 0
    while pos < len(p):
        b = p[pos]
        if b in (0xCF, 0xD3, 0xCB):
            if len(p) - pos < 9:
                return False
            pos += 9
            continue
        n, items = _token(p, pos)
        if n < 0 or b not in PLAIN_FIRST:
            return False
        pos += n
        if items > 0 and (ids := _ids_bytes(p, pos, items)) > 0:
            pos += ids
    return True


def packed(payloads: list[bytes], granules: GranuleIndex | None) -> tuple[list[bytes], int, bool]:
    """`pack_runs`' columns of one chunk, its count kept verbatim, and whether it was checked."""
    before = checks_made()
    ((parts, kept),) = pack_runs([payloads], [granules], [False])
    checked, trusted = (a - b for a, b in zip(checks_made(), before, strict=True))
    assert checked + trusted == 1
    return list(parts), kept, checked == 1


def comes_back(payloads: list[bytes]) -> None:
    """Packed with each index: the payloads back exactly, the split's own verbatim count kept
    (no chunk all verbatim for a check that failed), checked unless every payload is plain."""
    plain = all(map(plain_only, payloads))
    for granules in INDEXES:
        parts, kept, checked = packed(payloads, granules)
        assert join(len(payloads), *parts, granules=granules) == payloads
        assert kept == split(payloads, granules=granules)[1]
        assert checked == (not plain)


HEADS = (0xDC, 0xDD, 0xDE, 0xDF)
"""The 16 and 32-bit arrays' and maps' headers (`HEADERS` draws them)."""

SCALARS = st.one_of(
    st.sampled_from(sorted(PLAIN_FIRST - {0xCF, 0xD3, 0xCB, *range(0x90, 0xA0), *HEADS})).flatmap(
        lambda b: st.binary(min_size=32, max_size=32).map(
            lambda rest: bytes([b]) + rest[: _token(bytes([b]) + rest, 0)[0] - 1]
        )
    ),
    st.binary(min_size=8, max_size=8).flatmap(
        lambda body: st.sampled_from([b"\xcf" + body, b"\xd3" + body, b"\xcb" + body])
    ),
    st.sampled_from([b"\xcf" + bytes(range(k, k + 8)) for k in range(3)]),
    st.sampled_from([b"\xcb" + bytes(8), b"\xcb\x3f\xf0" + bytes(6)]),
)
"""Each token the skeleton keeps whole, with any bytes in it, and 8-byte ints and floats (some
repeated, for the references)."""

HEADERS = st.one_of(
    st.integers(0, 1 << 20).flatmap(
        lambda n: st.integers(0, 2).map(lambda kind: array_header(n, kind))
    ),
    st.integers(0, 15).map(lambda n: bytes([0x80 | n])),
    st.integers(0, 0xFFFF).map(lambda n: b"\xde" + struct.pack(">H", n)),
    st.integers(0, 0xFFFFFFFF).map(lambda n: b"\xdf" + struct.pack(">I", n)),
)
"""An array's or a map's header, its items whatever follows."""

PLAIN_PIECE = st.one_of(SCALARS, SCALARS, HEADERS, token_run(), one_width_run(), run_of_granules())


@st.composite
def plain_payload(draw: st.DrawFn) -> bytes:
    return b"".join(draw(st.lists(PLAIN_PIECE, max_size=10)))


RARE_PIECES = [
    b"\xc4\x02ab",
    b"\xc5\x00\x01z",
    b"\xc6\x00\x00\x00\x00",
    b"\xc7\x01\x05q",
    b"\xc8\x00\x00\x05",
    b"\xc9\x00\x00\x00\x01\x05r",
    b"\xd9\x03abc",
    b"\xda\x00\x01x",
    b"\xdb\x00\x00\x00\x00",
    b"\xc1",
    b"\xdd\x00\x00",
    b"\xcf\x01\x02",
    b"\xcd\x01",
]
"""One of each path but the plain ones: a length and a body, 0xC1, tokens cut short."""


def test_plain_pieces_alone_are_trusted() -> None:
    pieces = [b"\x00", b"\x7f", b"\xe0", b"\xc0", b"\xc3", b"\xa2hi", b"\x82", b"\xca" + bytes(4)]
    pieces += [b"\xcc\x01", b"\xd2" + bytes(4), b"\xd8\x01" + bytes(16), b"\xcf" + bytes(8)]
    pieces += [b"\xd3" + bytes(8), b"\xcb" + bytes(8), b"\x93\x01\x02\x03", b"\x90"]
    pieces += [b"\xdc\x00\x02\xcd\x01\x02\x05", b"\x92\xcf" + bytes(8) + b"\xc0"]
    pieces += [b"\xdd\x00\x00\x00\x02\x01\x02", b"\xde\x00\x01\xa1k\x01", b"\xdf" + bytes(4)]
    for piece in pieces:
        assert plain_only(piece)
        comes_back([piece, piece + piece])


@pytest.mark.parametrize("piece", RARE_PIECES)
def test_each_other_path_marks_its_chunk_checked(piece: bytes) -> None:
    assert not plain_only(piece)
    plain = msgspec.msgpack.encode([1.5, [{"h": [2**64 - 1], "t": list(range(300, 340))}], 0])
    comes_back([plain, plain + piece, plain])
    comes_back([piece + plain, plain])


@SETTINGS
@given(st.lists(plain_payload(), min_size=1, max_size=6))
def test_plain_paths_come_back_unchecked(payloads: list[bytes]) -> None:
    assert all(map(plain_only, payloads))
    comes_back(payloads)


@SETTINGS
@given(
    st.lists(plain_payload(), min_size=1, max_size=4),
    st.lists(hostile_payload(), min_size=1, max_size=4),
    st.randoms(use_true_random=False),
)
def test_plain_and_hostile_payloads_mixed_come_back(
    plain: list[bytes], hostile: list[bytes], rng: random.Random
) -> None:
    payloads = plain + hostile
    rng.shuffle(payloads)
    comes_back(payloads)


@SETTINGS
@given(st.lists(ANY_MSGPACK, min_size=1, max_size=6), st.integers(0, 300))
def test_any_msgpack_and_its_cut_short_forms_come_back(values: list[object], cut: int) -> None:
    payloads = [msgspec.msgpack.encode(v) for v in values]
    comes_back(payloads)
    comes_back(payloads + [p[:cut] + p[cut + 1 :] for p in payloads])


@SETTINGS
@given(st.data())
def test_vllm_shaped_batches_come_back(data: st.DataObject) -> None:
    """Every width a sender may pick (`wild`), and floats and ints of 8 bytes as the test's
    strategies draw them."""
    wild = data.draw(st.booleans())
    values = data.draw(st.lists(batch(wild), min_size=1, max_size=6))
    comes_back([encoded(data, v) for v in values])


def test_every_first_byte_after_every_plain_piece() -> None:
    """Each first byte after each plain piece, whole or cut short: where the plain path ends
    and another begins, the chunk is checked; where none does, it comes back unchecked."""
    heads = [b"", b"\x01", b"\x92", b"\xdc\x00\x03", b"\xcf" + bytes(range(8)), b"\xcb" + bytes(8)]
    heads += [b"\x93\x01\xcd\x01\x00\xd2\xff\xff\xff\xfe", b"\xa3abc"]
    tails = [b"", b"\x01", b"\x05\x06", bytes(range(1, 20)), bytes(40)]
    for head in heads:
        payloads = [head + bytes([b]) + tail for b in range(256) for tail in tails]
        for p in payloads:
            comes_back([p])


@pytest.mark.parametrize("name", ["lab_10rps_300s.msgpack.gz", "lab_3rps_180s.msgpack.gz"])
def test_recordings_take_the_plain_paths_alone(name: str) -> None:
    """What vLLM sends takes only the plain paths: its chunks are packed unchecked."""
    payloads = [record.frames[-1] for record in read_capture(capture_path(name))]
    for start in range(0, len(payloads), 1000):
        part = payloads[start : start + 1000]
        assert all(map(plain_only, part))
        for granules in INDEXES:
            parts, kept, checked = packed(part, granules)
            assert kept == 0 and not checked
            assert join(len(part), *parts, granules=granules) == part


def test_the_plain_reading_itself() -> None:
    """A guard on `plain_only`: whole plain tokens and runs are plain, the others not."""
    assert plain_only(b"\xce" + struct.pack(">I", 7) + b"\xd1\x00\x01\x93\x01\x02")
    assert plain_only(b"\xdc\x00\x03\x01\x02")  # a run cut short: its ids read one by one
    assert not plain_only(b"\xce\x00")
    assert not plain_only(b"\x91\xd9\x01a")


@pytest.mark.parametrize(("seed", "odd", "fmt"), [(1, 0.0, 6), (2, 0.0, 5), (3, 0.3, 6)])
def test_noted_payloads_walked_in_the_split_come_back(seed: int, odd: float, fmt: int) -> None:
    """The split that notes the stream's content as it walks (its tracking of the note's
    reading beside the plain paths) packs chunks unchecked that read back as their batches."""
    rng = random.Random(seed)
    rows = batches(rng, 1200, odd)
    packer = LogPacker(cap=6_000, ratio=0.5, fmt=fmt)
    made: dict[bytes, Dictionary] = {}
    checks, noted = checks_made(), notes_read()[0]
    start = 0
    while start < len(rows):
        end = start + rng.randint(1, 80)
        chunks, dictionaries = packer.pack(rows[start:end])
        for row in dictionaries:
            made.setdefault(row.digest, from_stored(row.data))
        for chunk in chunks:
            read = Chunk(chunk.data, made[chunk.dictionary] if chunk.dictionary else None)
            assert [tuple(read.batch(i)) for i in range(len(read))] == [
                (r[2], r[3], r[4], r[5])
                for r in rows[start:end]
                if r[0] == chunk.stream and chunk.first_seq <= r[2] <= chunk.last_seq
            ]
        packer.committed(dictionaries)
        start = end
    assert notes_read()[0] > noted  # the split's walk noted payloads
    checked, trusted = (a - b for a, b in zip(checks_made(), checks, strict=True))
    assert trusted > 0
    assert (checked > 0) == (odd > 0)
