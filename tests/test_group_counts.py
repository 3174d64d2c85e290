"""collector/_table_counts.pyx's group counts say what the per-hash Python they replaced
(`reference_counts`, below) says: per group of a before map, its blocks cached again, hittable
again, and shared and hittable again in a followed table, on random tables (orphans, shared
prefixes, removals, cycles), whichever of the two maps is the smaller."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._slot_map import SlotMap
from kvscope.collector._table_chains import chain_groups
from kvscope.collector._table_counts import add_group_counts
from kvscope.collector.block_table import BlockTable
from tests.test_table_chains import _ops, _table, groups_of


def reference_counts(
    table: BlockTable, members: dict[int, int], shared: set[int]
) -> dict[int, list[int]]:
    """storage/reset_follower.py's `_state_of` over one table, before it was compiled."""
    counts: dict[int, list[int]] = {}
    for h in table.counts().keys() & members.keys():
        found = counts.setdefault(members[h], [0, 0, 0])
        found[0] += 1
        if table.is_hittable(h):
            found[1] += 1
            if h in shared:
                found[2] += 1
    return counts


def _compiled(table: BlockTable, marks: SlotMap, groups: int) -> dict[int, list[int]]:
    counts = array("i", bytes(12 * groups))
    add_group_counts(table, marks, counts)
    return {
        g: list(counts[3 * g : 3 * g + 3]) for g in range(groups) if any(counts[3 * g : 3 * g + 3])
    }


Ops = list[tuple[bool, list[int], int | None]]


@settings(max_examples=400, deadline=None)
@given(_ops, _ops, st.integers(0, 3))
def test_group_counts_equal_the_reference(before_ops: Ops, followed_ops: Ops, first: int) -> None:
    before, followed = _table(before_ops), _table(followed_ops)
    marks = chain_groups(before, first)[0]
    members, shared, roots, _, _ = groups_of(before, first)
    groups = first + len(roots)
    assert _compiled(followed, marks, groups) == reference_counts(followed, members, shared)


def test_either_map_may_be_walked() -> None:
    # A before map larger than the followed table, then smaller: both walks count the same.
    before = _table([(True, list(range(1, 30)), None), (True, [40, 41], 5)])
    marks = chain_groups(before, 0)[0]
    members, shared, roots, _, _ = groups_of(before, 0)
    small = _table([(True, [1, 2, 3], None), (True, [41], 40)])
    large = _table([(True, list(range(1, 60)), None), (True, [40, 41], 5)])
    for followed in (small, large):
        assert _compiled(followed, marks, len(roots)) == reference_counts(followed, members, shared)
    assert len(small) < len(members) < len(large)


def test_a_group_past_the_counts_is_refused() -> None:
    table = _table([(True, [1, 2], None)])
    with pytest.raises(IndexError):
        marks = SlotMap()
        marks[1], marks[2] = 0, 2  # groups 0 and 1, the counts room for one
        add_group_counts(table, marks, array("i", bytes(12)))
