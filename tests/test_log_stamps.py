"""A transaction's log rows as the writer packs them: their fields read into lists in C, the
batches' seqs and times made arrays in one call per transaction, not one conversion per value,
and a chunk's earliest and latest times read in C; each is what Python's own `itemgetter`,
`array` and `min`/`max` give, whatever the values."""

from __future__ import annotations

import math
import random
from array import array
from operator import itemgetter

import pytest

from kvscope.collector.types import StreamId
from kvscope.storage._log_columns import fields
from kvscope.storage._log_planes import low_high
from kvscope.storage.log_chunk_pack import stamp_arrays


@pytest.mark.parametrize("seed", range(5))
def test_low_high_is_min_and_max(seed: int) -> None:
    rng = random.Random(seed)
    odd = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -5e-324]
    values = [rng.choice(odd) if rng.random() < 0.3 else rng.uniform(-1e9, 1e9) for _ in range(50)]
    for n in range(1, len(values)):
        got = low_high(array("d", values[:n]))
        want = (min(values[:n]), max(values[:n]))
        assert repr(got) == repr(want)  # NaN and -0.0 kept where min and max keep them


def test_low_high_of_nothing_is_refused_as_min_refuses_it() -> None:
    with pytest.raises(ValueError):
        low_high(array("d"))


def test_stamp_arrays_are_array_s() -> None:
    seqs = [0, 1, (1 << 63) - 1, 7]
    ts = [1.5, 2, -0.0, math.inf]
    got = stamp_arrays(seqs, ts, ts)
    assert got == (array("q", seqs), array("d", ts), array("d", ts))


def test_the_rows_fields_are_read_as_itemgetter_reads_them() -> None:
    rows = [(StreamId("a", 0), 0, seq, 1.0 + seq, 2.0 + seq, b"x" * seq) for seq in range(5)]
    assert fields(rows, 6) == [list(map(itemgetter(k), rows)) for k in range(6)]
    assert fields([], 6) == [[] for _ in range(6)]


def test_rows_that_are_not_plain_tuples_of_the_fields_are_left_to_the_caller() -> None:
    class Row(tuple):  # type: ignore[type-arg]
        pass

    assert fields([(1, 2, 3), (1, 2)], 3) is None
    assert fields([(1, 2, 3), Row((1, 2, 3))], 3) is None
    assert fields([(1, 2, 3), [1, 2, 3]], 3) is None
