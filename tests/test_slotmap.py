"""The compiled hash -> slot map behaves as the dict it replaces (collector/_slot_map.pyx)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._slot_map import SlotMap

# Small keys collide in the table's low bits; large ones cover the whole uint64 range.
keys = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1))
ops = st.lists(
    st.tuples(st.sampled_from(["set", "del", "get"]), keys, st.integers(0, 2**31 - 1)),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_same_answers_as_a_dict(steps: list[tuple[str, int, int]]) -> None:
    made, model = SlotMap(), dict[int, int]()
    for op, key, value in steps:
        if op == "set":
            made[key] = value
            model[key] = value
        elif op == "del":
            if key in model:
                del made[key]
                del model[key]
            else:
                with pytest.raises(KeyError):
                    del made[key]
        assert made.get(key, -7) == model.get(key, -7)
        assert (key in made) == (key in model)
    assert len(made) == len(model)
    assert dict(made.items()) == model
    assert sorted(made) == sorted(model)
    assert sorted(made.values()) == sorted(model.values())
    hashes, slots = made.to_arrays()
    assert dict(zip(hashes, slots, strict=True)) == model
    assert dict(SlotMap.from_arrays(hashes, slots).items()) == model
    assert dict(SlotMap.from_arrays(list(hashes), list(slots)).items()) == model


def test_drains_and_refills_through_every_size() -> None:
    made = SlotMap()
    for round_ in range(3):
        for key in range(50_000):
            made[key * 7919 + round_] = key
        assert len(made) == 50_000
        for key in range(50_000):
            assert made[key * 7919 + round_] == key
            del made[key * 7919 + round_]
        assert len(made) == 0


def test_keys_out_of_range_are_absent_not_errors() -> None:
    made = SlotMap()
    made[5] = 1
    assert made.get(-1) is None and made.get(2**64, 3) == 3
    assert -1 not in made and "5" not in made
    with pytest.raises(KeyError):
        made[-1]


def test_changing_it_while_iterating_raises_as_a_dict_does() -> None:
    made = SlotMap()
    for key in range(100):
        made[key] = key
    with pytest.raises(RuntimeError):
        for key in made:
            made[key + 1000] = 0


GROWN_KEYS = 1_000_000
"""Enough entries that every array a resize outgrows is large (a heap allocation would keep it)."""


def test_growing_gives_the_outgrown_arrays_back() -> None:
    # In a fresh interpreter, so that no earlier test's free heap takes the arrays.
    script = f"""
import os
from kvscope.collector._slot_map import SlotMap

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

# A large block freed, as the table's columns free theirs when they grow: the C library then
# serves blocks up to its size from the heap, and a heap block freed stays resident.
block = bytearray(24 << 20)
del block
made = SlotMap()
before = rss()
for key in range({GROWN_KEYS}):
    made[key * 0x9E3779B97F4A7C15 % 2**64] = key
print(rss() - before, made.nbytes())
"""
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    grown, held = map(int, out.stdout.split())
    # The outgrown arrays together are about as large as the last: kept, they double it.
    assert grown < held * 1.25, (grown, held)


def test_a_large_table_stays_near_full_at_every_size() -> None:
    # Bytes per entry (12 at full load) over the table's load: a table that doubles sits at
    # half its load at some sizes, whatever its maximum load.
    made = SlotMap()
    worst = 0.0
    for key in range(1, 400_001):
        made[key * 0x9E3779B97F4A7C15 % 2**64] = key
        if key >= 100_000 and key % 97 == 0:
            worst = max(worst, made.nbytes() / key)
    assert worst <= 20.5, worst
    hashes, slots = made.to_arrays()
    assert SlotMap.from_arrays(hashes, slots).nbytes() / len(made) <= 20.5
