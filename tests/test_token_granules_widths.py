"""A stream's content notes the token runs of arrays whose items are all ints from 0 to 2**32 - 1
(storage/_token_granules.pyx), in every msgpack form a sender may pick for them (a signed form,
a wider one than needed): read by their bytes, each such form counts, and any other item (a
negative int, a value past 32 bits, anything not an int) leaves its array out."""

from __future__ import annotations

import random
import struct

import pytest

from kvscope.storage._token_granules import RunTable
from kvscope.storage.log_dictionary import GRANULE


def forms(v: int) -> list[bytes]:
    """Every msgpack encoding of the int `v` (>= 0) that holds it."""
    out = []
    if v < 0x80:
        out.append(bytes([v]))
    for first, fmt, most in (
        (0xCC, ">B", 1 << 8),
        (0xCD, ">H", 1 << 16),
        (0xCE, ">I", 1 << 32),
        (0xCF, ">Q", 1 << 64),
        (0xD0, ">b", 1 << 7),
        (0xD1, ">h", 1 << 15),
        (0xD2, ">i", 1 << 31),
        (0xD3, ">q", 1 << 63),
    ):
        if v < most:
            out.append(bytes([first]) + struct.pack(fmt, v))
    return out


NOT_IDS = [
    b"\xff",  # -1, a negative fixint
    b"\xd0\x80",  # int8 -128
    b"\xd2\xff\xff\xff\xff",  # int32 -1
    b"\xcf\x00\x00\x00\x01\x00\x00\x00\x00",  # uint64 2**32
    b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",  # int64 below zero
    b"\xc0",  # nil
    b"\xca\x00\x00\x00\x00",  # float32
]


def array(items: list[bytes]) -> bytes:
    return b"\xdc" + struct.pack(">H", len(items)) + b"".join(items)


@pytest.mark.parametrize("seed", range(6))
def test_every_form_of_a_32_bit_id_counts_and_any_other_item_leaves_its_array_out(
    seed: int,
) -> None:
    rng = random.Random(seed)
    values = [rng.choice([rng.randrange(128), rng.randrange(1 << 16), rng.randrange(1 << 32)])]
    values += [rng.randrange(1 << rng.choice((7, 8, 15, 16, 31, 32))) for _ in range(GRANULE * 4)]
    ids = [rng.choice(forms(v)) for v in values]
    bad = list(ids)
    bad[rng.randrange(len(bad))] = rng.choice(NOT_IDS)
    table = RunTable(GRANULE)
    table.note([b"\x92" + array(ids) + array(bad)], 1, 1)
    whole = len(ids) // GRANULE * GRANULE
    expected = [b"".join(ids[i : i + GRANULE]) for i in range(0, whole, GRANULE)]
    assert table.runs() == list(dict.fromkeys(expected))
