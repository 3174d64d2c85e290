"""storage/_log_known.pyx's KnownHashes: every listed hash is found at its position, nothing else
is, however the hashes spread over the bucket index (sizes at its boundaries, hashes sharing
their top bits); and a list that is not strictly increasing is refused."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.storage._log_known import KnownHashes, join_known, split_known

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MASK64 = (1 << 64) - 1

BOUNDARY_SIZES = sorted(
    {0, 1, 2, 3}
    | {n + d for k in range(2, 13) for n in (1 << k,) for d in (-1, 0, 1)}
    | {2 * n + d for k in range(2, 12) for n in (1 << k,) for d in (-1, 1)}
)
"""Around each power of two (and twice it): where the index's bucket count changes."""


def be(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(8, "big") for v in values)


def _one(kind: str, rnd: random.Random, size: int, top: int, low: int) -> int:
    if kind == "uniform":
        return rnd.getrandbits(64)
    if kind == "shared top":
        return top | rnd.getrandbits(low)
    if kind == "cluster":  # most in one narrow range, a few anywhere
        if rnd.random() < 0.01:
            return rnd.getrandbits(64)
        return (top + rnd.getrandbits(max(12, size.bit_length() + 2))) & MASK64
    return rnd.choice([rnd.getrandbits(8), MASK64 - rnd.getrandbits(8)])  # at both ends


@st.composite
def hash_sets(draw: st.DrawFn) -> list[int]:
    """Distinct 64-bit hashes, ascending: uniform, or sharing their top bits (the index's worst
    case), or most in one narrow cluster with a few far away, or at both ends of the range."""
    size = draw(st.sampled_from(BOUNDARY_SIZES) | st.integers(0, 3000))
    kind = draw(st.sampled_from(["uniform", "shared top", "cluster", "ends"]))
    rnd = draw(st.randoms(use_true_random=False))
    low = draw(st.integers(min_value=max(1, size.bit_length() + 1), max_value=64))
    top = rnd.getrandbits(64) & ~((1 << low) - 1) & MASK64
    values: set[int] = set()
    for _ in range(4 * size + 16):
        if len(values) >= size:
            break
        values.add(_one(kind, rnd, size, top, low))
    return sorted(values)


@SETTINGS
@given(hash_sets(), st.randoms(use_true_random=False))
def test_every_listed_hash_is_found_at_its_position_and_no_other(
    hashes: list[int], rnd: random.Random
) -> None:
    known = KnownHashes(be(hashes))
    assert known.count == len(hashes) and known.values == be(hashes)
    listed = set(hashes)
    near = [(h + d) & MASK64 for h in hashes[:200] for d in (-1, 1)]
    others = [o for o in near + [0, MASK64, 1 << 63] if o not in listed]
    others += [o for o in (rnd.getrandbits(64) for _ in range(200)) if o not in listed]
    lits = list(hashes) + others
    rnd.shuffle(lits)
    bitmap, planes, rest = split_known(be(lits), known)

    found = [i for i in range(len(lits)) if bitmap[i >> 3] >> (i & 7) & 1]
    assert [lits[i] for i in found] == [h for h in lits if h in listed]
    n = len(found)
    positions = [sum(planes[k * n + j] << (8 * k) for k in range(4)) for j in range(n)]
    assert [hashes[p] for p in positions] == [lits[i] for i in found]
    assert rest == be([h for h in lits if h not in listed])
    assert join_known(bitmap, planes, rest, known) == be(lits)


@pytest.mark.parametrize(
    "values",
    [[2, 1], [1, 1], [5, 7, 7, 9], [0, 3, 2, 4], [1 << 63, 1], [MASK64, 0]],
    ids=["two", "a pair", "a duplicate", "one step down", "top bit", "the ends"],
)
def test_hashes_not_strictly_increasing_are_refused(values: list[int]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        KnownHashes(be(values))


def test_random_hashes_held_in_fewer_bytes_than_their_list() -> None:
    """The writer holds its latest checkpoint's hashes for as long as the checkpoint is the
    latest: each hash's bits below its bucket's, not all 8 bytes, and a bucket per several."""
    rnd = random.Random(7)
    hashes = sorted({rnd.getrandbits(64) for _ in range(800_000)})
    known = KnownHashes(be(hashes))
    assert known.nbytes <= 7 * len(hashes)
    assert known.values == be(hashes)
