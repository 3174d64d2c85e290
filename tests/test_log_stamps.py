"""A chunk's stamps as the writer packs them: the batches' seqs and times become arrays in one
call per transaction, not one conversion per value, and a chunk's earliest and latest times
are read in C; each is what Python's own `array` and `min`/`max` give, whatever the values."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from kvscope.storage._log_planes import low_high
from kvscope.storage.log_chunks import stamp_arrays


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
