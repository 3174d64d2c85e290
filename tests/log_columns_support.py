"""Format 3 and 4 columns made from block payloads, and damaged ones: what
tests/test_log_columns_damaged.py and tests/test_log_joins_back.py read back."""

from __future__ import annotations

import random
from array import array
from typing import NamedTuple

from hypothesis import strategies as st

from kvscope.storage import log_columns
from kvscope.storage._granules import GranuleIndex
from kvscope.storage.log_dictionary import Dictionary
from tests.test_log_dictionary import block_log, runs_of, token_pool

SKELETON, TOKENS, GREFS = 1, 5, 6
"""Indexes of `join`'s columns (after the count): skeleton, token ids, granule numbers."""


def made(fmt: int) -> tuple[list[bytes], list[bytes], GranuleIndex | None]:
    """Payloads of blocks from a pool, their columns, and the index they were split with."""
    rng = random.Random(11)
    pool = token_pool(rng, 200)
    payloads = [row[5] for row in block_log(rng, 40, pool)]
    content = b"".join(run for block in pool for run in runs_of(block))
    granules = Dictionary(content).granules if fmt == 4 else None
    n = len(payloads)
    stamps = array("q", range(n)), array("d", [0.0] * n), array("d", [0.0] * n)
    frames, verbatim = log_columns.columns(*stamps, payloads, granules)
    assert verbatim == 0
    return payloads, frames[1:], granules


FORMAT_3, FORMAT_4 = made(3), made(4)


class Damaged(NamedTuple):
    """A chunk's payloads, its columns whole and with one of them damaged, and the count a
    reader is told (off by `count_off`)."""

    payloads: list[bytes]
    columns: list[bytes]
    damaged: list[bytes]
    granules: GranuleIndex | None
    count_off: int


@st.composite
def damaged_columns(draw: st.DrawFn) -> Damaged:
    """Format 3 or 4 columns with bytes overwritten or cut at a point of one of them (the
    skeleton, the token ids or the granules' numbers), and a count off by up to 2."""
    fmt = draw(st.sampled_from([3, 4]))
    which = draw(st.sampled_from([0, SKELETON, TOKENS, GREFS]))
    at = draw(st.integers(0, 1 << 20))
    junk = draw(st.binary(min_size=1, max_size=12))
    cut = draw(st.booleans())
    count_off = draw(st.integers(-2, 2))
    payloads, columns, granules = FORMAT_4 if fmt == 4 else FORMAT_3
    if fmt == 3 and which == GREFS:
        which = TOKENS
    damaged = [*columns]
    column = damaged[which]
    at %= len(column) + 1
    damaged[which] = column[:at] + (b"" if cut else junk + column[at + len(junk) :])
    return Damaged(payloads, columns, damaged, granules, count_off)
