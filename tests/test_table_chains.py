"""collector/_table_chains.pyx groups a table's blocks exactly as the per-block Python it
replaced (kept below as the reference): the same roots, shared blocks and groups, hash for
hash, on random tables with orphans, shared prefixes, removals and hash cycles. And the
table's whole-table reads a reset makes (`hash_array`, `hittable_hash_array`, `count_cached`)
say what the per-hash reads say."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._table_chains import chain_groups
from kvscope.collector.block_table import BlockTable
from kvscope.collector.types import TableKey

KEY = TableKey("GPU", 0)

_Groups = tuple[dict[int, int], set[int], list[int], list[int], list[int]]


def groups_of(table: BlockTable, first: int) -> _Groups:
    """`chain_groups`' answer as the reference gives it: its marks (hash -> group * 2, plus 1
    if shared) as the members' groups and the shared hashes."""
    marks, roots, sizes, shared_sizes = chain_groups(table, first)
    members = {h: mark >> 1 for h, mark in marks.items()}
    shared = {h for h, mark in marks.items() if mark & 1}
    return members, shared, roots, sizes, shared_sizes


def reference_chains(table: BlockTable) -> tuple[dict[int, int], set[int]]:
    """storage/reset_follower.py's `_chains` before it was compiled, unchanged."""
    present = table.counts()
    parent_of = {h: table.parent_of(h) for h in present}
    root_of: dict[int, int] = {}
    order: list[int] = []
    longest = len(present)
    for start in present:
        parent = parent_of[start]
        known = None if parent is None else root_of.get(parent)
        if known is not None:
            root_of[start] = known
            order.append(start)
            continue
        path: list[int] = []
        h = start
        while h not in root_of:
            parent = parent_of[h]
            if parent is None or parent not in present or len(path) > longest:
                root_of[h] = h
                order.append(h)
                break
            path.append(h)
            h = parent
        root = root_of[h]
        for member in reversed(path):
            if member not in root_of:
                root_of[member] = root
                order.append(member)
    edges = [(h, p) for h in order if root_of[h] != h and (p := parent_of[h]) is not None]
    leaves = dict.fromkeys(present, 1)
    leaves.update(dict.fromkeys((parent for _, parent in edges), 0))
    for h, parent in reversed(edges):
        leaves[parent] += leaves[h]
    return root_of, {h for h, n in leaves.items() if n >= 2}


def reference_groups(table: BlockTable, first: int) -> _Groups:
    """`ResetFollower._take_before`'s loop over one table, before it was compiled."""
    root_of, shared = reference_chains(table)
    index: dict[int, int] = {}
    members: dict[int, int] = {}
    roots: list[int] = []
    sizes: list[int] = []
    shared_sizes: list[int] = []
    for h in sorted(root_of):
        root = root_of[h]
        group = index.get(root)
        if group is None:
            group = index[root] = len(roots)
            roots.append(root)
            sizes.append(0)
            shared_sizes.append(0)
        members[h] = first + group
        sizes[group] += 1
        shared_sizes[group] += h in shared
    return members, shared, roots, sizes, shared_sizes


def _table(ops: list[tuple[bool, list[int], int | None]]) -> BlockTable:
    table = BlockTable(KEY, 0.0)
    for store, hashes, parent in ops:
        if store:
            table.store_chain(hashes, parent, [], 1, 1.0)
        else:
            table.remove(hashes)
    return table


def _ops_of(
    hashes: st.SearchStrategy[int], chain: int, ops: int, removals: bool
) -> st.SearchStrategy[list[tuple[bool, list[int], int | None]]]:
    """Stores (chains of up to `chain` of `hashes` under a parent, or none) and, with
    `removals`, a removal a quarter of the time."""
    store = st.sampled_from([True, True, True, False]) if removals else st.just(True)
    op = st.tuples(
        store,
        st.lists(hashes, min_size=1, max_size=chain, unique=True),
        st.one_of(st.none(), hashes),
    )
    return st.lists(op, max_size=ops)


# Hashes from a small range, so that chains share blocks, parents go missing and come back,
# and a chain may name a block below it as its parent (a cycle); some past 2**63 (uint64).
_hashes = st.one_of(st.integers(0, 40), st.integers(2**64 - 8, 2**64 - 1))
_ops = _ops_of(_hashes, chain=6, ops=40, removals=True)


@settings(max_examples=400, deadline=None)
@given(_ops, st.integers(0, 5))
def test_chain_groups_equal_the_reference(
    ops: list[tuple[bool, list[int], int | None]], first: int
) -> None:
    table = _table(ops)
    assert groups_of(table, first) == reference_groups(table, first)


# Hashes over the whole range, and ones that differ in one middle byte alone: the groups are
# numbered in hash order (a radix sort, a byte a pass, that skips the bytes all share).
_wide = st.one_of(
    st.integers(0, 2**64 - 1),
    st.integers(0, 255).map(lambda b: (b << 40) | 0xABCD),
    st.integers(0, 255).map(lambda b: (b << 56) | (b << 8)),
)
_wide_ops = _ops_of(_wide, chain=30, ops=30, removals=False)


@settings(max_examples=300, deadline=None)
@given(_wide_ops)
def test_groups_are_numbered_in_hash_order_over_the_whole_range(
    ops: list[tuple[bool, list[int], int | None]],
) -> None:
    table = _table(ops)
    assert groups_of(table, 0) == reference_groups(table, 0)


def test_a_cycle_is_cut_as_the_reference_cuts_it() -> None:
    # 2 names 1 as its parent, then 1 is stored under 2: each is the other's parent.
    table = _table([(True, [2], 1), (True, [1], 2), (True, [3, 4], 2), (True, [5], 2)])
    members, shared, roots, sizes, _ = groups_of(table, 0)
    assert (members, shared, roots, sizes) == reference_groups(table, 0)[:4]
    assert sum(sizes) == 5 and len(roots) == 1


def test_groups_by_smallest_hash_with_shared_trunks() -> None:
    # Root 10 with two prefixes (10-11-12, 10-11-13): 10 and 11 are shared; 20-21 one chain.
    table = _table([(True, [20, 21], None), (True, [10, 11, 12], None), (True, [13], 11)])
    members, shared, roots, sizes, shared_sizes = groups_of(table, 3)
    assert roots == [10, 20]
    assert members == {10: 3, 11: 3, 12: 3, 13: 3, 20: 4, 21: 4}
    assert shared == {10, 11}
    assert (sizes, shared_sizes) == ([4, 2], [2, 0])


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_hashes_and_hittable_hashes_read_as_counts_and_is_hittable_say(
    ops: list[tuple[bool, list[int], int | None]],
) -> None:
    # What a recovery keeps of the map at a clear (storage/recovery.py), read in one pass.
    table = _table(ops)
    assert table.hashes() == frozenset(table.counts())
    assert sorted(table.hash_array()) == sorted(table.counts())
    hittable = table.hittable_hash_array()
    assert hittable.typecode == "Q"
    assert sorted(hittable) == sorted(h for h in table.counts() if table.is_hittable(h))


@settings(max_examples=200, deadline=None)
@given(_ops, st.lists(_hashes, unique=True))
def test_counts_over_other_hashes_are_the_per_hash_reads(
    ops: list[tuple[bool, list[int], int | None]], others: list[int]
) -> None:
    # What a recovery point reads of the map before the clear (storage/recovery.py).
    table = _table(ops)
    hashes = array("Q", sorted(frozenset(others) | table.hashes()))
    assert table.count_cached(hashes) == sum(1 for h in hashes if h in table)
    assert table.count_cached(hashes, hittable=True) == sum(
        1 for h in hashes if table.is_hittable(h)
    )
