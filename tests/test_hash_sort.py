"""storage/_hash_sort.pyx's sorted_hashes: a checkpoint's hashes, distinct and ascending, as a
writer and every reader make them alike, whatever their spread: a large list is first spread
into buckets by its top bits (one pass), each bucket then sorted on its own, and a bucket that
takes most of the list (hashes sharing their top bits) still comes back sorted."""

from __future__ import annotations

import random
from array import array

import pytest

from kvscope.storage._hash_sort import SPREAD_FROM, sorted_hashes

MASK64 = (1 << 64) - 1


def expected(arrays: list[array[int]]) -> bytes:
    return b"".join(v.to_bytes(8, "big") for v in sorted({v for a in arrays for v in a}))


def spread(kind: str, n: int, rnd: random.Random) -> list[int]:
    if kind == "uniform":
        return [rnd.getrandbits(64) for _ in range(n)]
    if kind == "shared top":  # one bucket holds them all
        top = rnd.getrandbits(64) & ~((1 << 40) - 1)
        return [top | rnd.getrandbits(40) for _ in range(n)]
    if kind == "few buckets":  # a few large buckets, the rest empty
        tops = [rnd.getrandbits(64) & ~((1 << 48) - 1) for _ in range(5)]
        return [rnd.choice(tops) | rnd.getrandbits(48) for _ in range(n)]
    if kind == "repeats":  # each value several times, in several arrays
        pool = [rnd.getrandbits(64) for _ in range(max(1, n // 4))]
        return [rnd.choice(pool) for _ in range(n)]
    if kind == "ends":
        return [rnd.choice([rnd.getrandbits(8), MASK64 - rnd.getrandbits(8)]) for _ in range(n)]
    assert kind == "counting"  # small consecutive values: all in bucket 0
    start = rnd.getrandbits(20)
    return [start + i for i in range(n)][::-1]


@pytest.mark.parametrize(
    "kind", ["uniform", "shared top", "few buckets", "repeats", "ends", "counting"]
)
@pytest.mark.parametrize(
    "n", [0, 1, 2, SPREAD_FROM - 1, SPREAD_FROM, SPREAD_FROM + 1, 3 * SPREAD_FROM + 7, 150_001]
)
def test_sorted_hashes_are_the_distinct_values_ascending(kind: str, n: int) -> None:
    rnd = random.Random(f"{kind}/{n}")
    values = spread(kind, n, rnd)
    cut = rnd.randrange(n + 1)
    arrays = [array("Q", values[:cut]), array("Q", []), array("Q", values[cut:])]
    assert sorted_hashes(list(arrays)) == expected(arrays)
    assert sorted_hashes([memoryview(a).cast("B") for a in arrays]) == expected(arrays)
