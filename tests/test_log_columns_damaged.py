"""Damaged format 3 and 4 columns (a corrupt or hostile chunk, or a reader given another
dictionary's granules) raise ValueError, whatever their bytes: a granule number past the
index, a token run cut short, a count that does not match. Never a read past the columns."""

from __future__ import annotations

import pytest
from hypothesis import given

from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_columns import join
from tests.log_columns_support import FORMAT_4, GREFS, Damaged, damaged_columns
from tests.test_log_columns import SETTINGS


def varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    return bytes(out + bytes([v]))


def test_the_columns_named_blocks_by_number() -> None:
    payloads, columns, granules = FORMAT_4
    assert granules is not None and len(granules) == 200
    assert any(columns[GREFS]) and join(len(payloads), *columns, granules=granules) == payloads


@pytest.mark.parametrize("number", [201, 202, 1 << 32, (1 << 63) + 1, (1 << 64) - 1])
def test_a_granule_number_past_the_index_raises(number: int) -> None:
    payloads, columns, granules = FORMAT_4
    grefs = columns[GREFS]
    first = grefs.index(next(b for b in grefs if b))  # a one-byte number: 200 granules
    damaged = [*columns]
    damaged[GREFS] = grefs[:first] + varint(number) + grefs[first + 1 :]
    with pytest.raises(ValueError):
        join(len(payloads), *damaged, granules=granules)


def test_another_dictionarys_granules_raise_or_give_other_bytes() -> None:
    """A reader handed a shorter index: its numbers past that index raise."""
    payloads, columns, granules = FORMAT_4
    with pytest.raises(ValueError):
        join(len(payloads), *columns, granules=GranuleIndex(b""))
    with pytest.raises(ValueError):
        join(len(payloads), *columns, granules=None)


@SETTINGS
@given(damaged_columns())
def test_damaged_columns_raise_or_give_payloads(chunk: Damaged) -> None:
    payloads, _, damaged, granules, count_off = chunk
    try:
        out = join(len(payloads) + count_off, *damaged, granules=granules)
    except ValueError:
        return
    assert len(out) == len(payloads) + count_off


@pytest.mark.parametrize("extra", [1, 1 << 40, (1 << 61) - 1, (1 << 63) - 1])
def test_a_count_past_the_sizes_raises(extra: int) -> None:
    """Each payload takes a byte of the sizes at least: a count past them is cut short, however
    large (never a table of that many starts, whose size would overflow)."""
    payloads, columns, granules = FORMAT_4
    count = min(len(payloads) + extra, (1 << 63) - 1)
    with pytest.raises(ValueError, match="sizes cut short"):
        join(count, *columns, granules=granules)
