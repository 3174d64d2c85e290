"""The table's free slots, kept in C: a store reuses the slot freed last, as the Python list they
were kept in did, whichever path freed it (a leaf, a root, an inner block dropped in Python), and
the list a checkpoint reads and writes is the same."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.block_table import BlockTable
from kvscope.collector.types import TableKey

GPU0 = TableKey("GPU", 0)
BLOCK = 2


class Model:
    """What the Python list kept: slots freed, the last one reused first; new slots from a
    high-water mark."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.high = 0
        self.slot: dict[int, int] = {}
        self.count: dict[int, int] = {}

    def store(self, hashes: list[int]) -> None:
        for h in hashes:
            if h in self.count:
                self.count[h] += 1
                continue
            if self.free:
                self.slot[h] = self.free.pop()
            else:
                self.slot[h] = self.high
                self.high += 1
            self.count[h] = 1

    def remove(self, hashes: list[int]) -> None:
        for h in hashes:
            if h not in self.count:
                continue
            self.count[h] -= 1
            if not self.count[h]:
                del self.count[h]
                self.free.append(self.slot.pop(h))


ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "remove", "again"]),
        st.integers(1, 5),  # blocks stored, or removed
        st.integers(0, 10**6),  # picks a parent, or what to remove
        st.booleans(),  # with tokens
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_slots_are_reused_as_the_list_reused_them(steps: list[tuple[str, int, int, bool]]) -> None:
    table, model = BlockTable(GPU0, 0.0), Model()
    fresh = iter(range(1, 10**9))
    for kind, n, pick, with_tokens in steps:
        live = sorted(model.count)
        if kind == "remove":
            # Leaves, roots, inner blocks (dropped in Python), and hashes never stored.
            gone = [live[(pick + 7 * k) % len(live)] for k in range(n)] if live else []
            gone.append(10**12 + pick)
            table.remove(gone)
            model.remove(gone)
        else:
            hashes = [next(fresh) for _ in range(n)]
            if kind == "again" and live:
                hashes[0] = live[pick % len(live)]  # another copy of a cached block
            # Under a cached block, under none (a root), or under a missing one (an orphan).
            parent = [None, live[pick % len(live)] if live else None, 10**13 + pick][pick % 3]
            tokens = [(pick + k) % 50_000 for k in range(n * BLOCK)] if with_tokens else []
            table.store_chain(hashes, parent, tokens, BLOCK, 1.0)
            model.store(hashes)
        assert table._free == model.free
        assert table._high == model.high
        assert dict(table._slot_of.items()) == model.slot
        assert table.counts() == model.count


def test_free_slots_set_as_a_list_are_reused_last_first() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain(list(range(1, 3001)), None, [], 0, 1.0)  # slots 0 to 2999
    table.remove(list(range(1, 3001)))
    freed = table._free
    assert freed == list(range(3000)) and table._high == 3000
    table._free = [5, 2999, 17]  # as a checkpoint restores them
    assert table._free == [5, 2999, 17]
    table.store_chain([9001, 9002], None, [], 0, 2.0)
    assert [table._slot_of[9001], table._slot_of[9002]] == [17, 2999]
    assert table._free == [5]


@pytest.mark.parametrize("bad", [[-1], [3, -2], [2**31]])
def test_a_free_slot_that_is_no_slot_is_refused_and_leaves_the_list(bad: list[int]) -> None:
    table = BlockTable(GPU0, 0.0)
    table._free = [4, 2]
    with pytest.raises((ValueError, OverflowError)):
        table._free = bad
    assert table._free == [4, 2]
