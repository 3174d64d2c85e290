"""The C table of a stream's token runs (storage/_run_table.pxd, `RunTable`) out of memory and
at its cap: an allocation that fails leaves it whole (what it holds, it finds), its index never
past half full, and its buffer of runs no more than its cap once it is evicted to it."""

from __future__ import annotations

import msgspec
import pytest

from kvscope.storage._token_granules import RunTable
from kvscope.storage.log_dictionary import GRANULE
from tests.test_log_dictionary import payload, stored


def tokens(k: int) -> list[int]:
    """A run of its own (token ids of 16 bits: 3 bytes each in msgpack)."""
    return list(range(300 + k * GRANULE, 300 + (k + 1) * GRANULE))


def run_batch(k: int) -> bytes:
    return payload([stored(tokens(k), [k])])


def run_bytes(k: int) -> bytes:
    return msgspec.msgpack.encode(tokens(k))[3:]  # past the array's header


RUN_BYTES = 3 * GRANULE


def test_a_failed_index_grow_holds_no_run_past_the_index_room() -> None:
    table = RunTable(GRANULE)
    for k in range(table.index_slots // 2 - 1):
        assert table.note([run_batch(k)], 1, 1) == (RUN_BYTES, 0)
    held = len(table)
    table.fail_allocations_after(0)
    for k in range(held, held + 20):
        with pytest.raises(MemoryError):
            table.note([run_batch(k)], 1, 2)
        assert 2 * len(table) < table.index_slots  # probing always ends at an empty slot
    table.fail_allocations_after(-1)
    for k in range(held, held + 100):
        assert table.note([run_batch(k)], 1, 3) == (RUN_BYTES, 0)
    every = [run_batch(k) for k in range(held + 100)]
    assert table.note(every, 1, 4) == (0, len(every) * RUN_BYTES)


@pytest.mark.parametrize("allocations", [0, 1])
def test_a_failed_eviction_drops_nothing_and_finds_every_run(allocations: int) -> None:
    table = RunTable(GRANULE)
    batches = [run_batch(k) for k in range(500)]
    for k, batch in enumerate(batches):
        table.note([batch], 1, 500 - k)  # the first noted, the most recently seen: sorted anew
    table.fail_allocations_after(allocations)
    with pytest.raises(MemoryError):
        table.evict(500 * RUN_BYTES, 0)
    table.fail_allocations_after(-1)
    assert len(table) == 500
    assert table.note(batches, 1, 1000) == (0, 500 * RUN_BYTES)
    assert table.runs() == [run_bytes(k) for k in range(500)]


def test_its_buffer_grows_little_past_its_cap_and_is_handed_back_at_eviction() -> None:
    cap = 4096
    table = RunTable(GRANULE, cap)
    fresh, _ = table.note([run_batch(k) for k in range(1000)], 1, 1)
    assert fresh == 1000 * RUN_BYTES
    assert table.reserved <= fresh + fresh // 8
    held = table.evict(fresh, 0.9 * cap)
    assert held <= 0.9 * cap and table.reserved <= cap
    assert len(table.content()) == held
