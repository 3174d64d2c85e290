"""The map against a plain reference model, and the behaviours vLLM's BlockPool implies."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearedMap, ClearReason
from kvscope.collector.token_query import TokenQuery
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    StreamId,
    TableKey,
)

GPU0 = TableKey("GPU", 0)
GPU1 = TableKey("GPU", 1)
CPU0 = TableKey("CPU", 0)
BS = 4


def tokens_of(block_hash: int) -> list[int]:
    return [block_hash * 10 + i for i in range(BS)]


def stored(hashes: list[int], parent: int | None, table: TableKey = GPU0) -> BlocksStored:
    tokens = [t for h in hashes for t in tokens_of(h)]
    return BlocksStored(list(hashes), parent, tokens, BS, table)


@dataclass
class Entry:
    copies: int
    parent: int | None


@dataclass
class Reference:
    """The obvious model: per table, hash -> its copies and parent."""

    tables: dict[TableKey, dict[int, Entry]] = field(default_factory=dict)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, AllCleared):
            self.tables.clear()
        elif isinstance(event, BlocksStored):
            table = self.tables.setdefault(event.table, {})
            parent = event.parent
            for h in event.hashes:
                if h in table:
                    table[h].copies += 1
                else:
                    table[h] = Entry(1, parent)
                parent = h
        else:
            table = self.tables.setdefault(event.table, {})
            for h in event.hashes:
                if h in table:
                    table[h].copies -= 1
                    if table[h].copies == 0:
                        del table[h]

    def hittable(self, key: TableKey) -> set[int]:
        table = self.tables.get(key, {})
        out = set()
        for h in table:
            seen = set()
            node: int | None = h
            while node is not None and node in table and node not in seen:
                seen.add(node)
                node = table[node].parent
            if node is None:
                out.add(h)
        return out

    def orphans(self, key: TableKey) -> int:
        table = self.tables.get(key, {})
        return sum(1 for e in table.values() if e.parent is not None and e.parent not in table)


def check_against(prefix_map: PrefixMap, ref: Reference) -> None:
    keys = {k for k, t in ref.tables.items() if t} | {k for k, t in prefix_map.tables.items() if t}
    for key in keys:
        table = prefix_map.tables.get(key)
        want = ref.tables.get(key, {})
        got = table.counts() if table is not None else {}
        assert got == {h: e.copies for h, e in want.items()}, key
        if table is None:
            continue
        for h, e in want.items():
            assert table.parent_of(h) == e.parent
        hittable = ref.hittable(key)
        assert {h for h in got if table.is_hittable(h)} == hittable
        assert table.hittable_count == len(hittable)
        assert table.orphan_count == ref.orphans(key)
        assert table.copies == sum(e.copies for e in want.values())


hashes = st.integers(min_value=0, max_value=12)  # a small space: duplicates, orphans, cycles
tables = st.sampled_from([GPU0, GPU1, CPU0])
events = st.one_of(
    st.builds(
        stored,
        st.lists(hashes, min_size=1, max_size=5),
        st.one_of(st.none(), hashes),
        tables,
    ),
    st.builds(BlocksRemoved, st.lists(hashes, min_size=1, max_size=4), tables),
    st.just(AllCleared()).map(lambda e: e),
)


def applied(batches: list[list[KVEvent]], ref: Reference) -> Iterator[PrefixMap]:
    """The map after each batch, with `ref` given the same events."""
    prefix_map = PrefixMap(StreamId("r", 0))
    for seq, batch_events in enumerate(batches):
        prefix_map.apply(Batch(seq, 1000.0 + seq, 0, batch_events))
        for event in batch_events:
            ref.apply(event)
        yield prefix_map


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(events, min_size=1, max_size=6), max_size=30))
def test_map_agrees_with_the_reference_model(batches: list[list[KVEvent]]) -> None:
    ref = Reference()
    for prefix_map in applied(batches, ref):
        check_against(prefix_map, ref)


def test_a_block_whose_parent_is_missing_is_kept_and_rejoins_when_the_parent_returns() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain([3, 4], parent=2, token_ids=tokens_of(3) + tokens_of(4), block_size=BS, ts=1)
    assert len(table) == 2 and table.orphan_count == 1 and table.hittable_count == 0
    table.store_chain(
        [1, 2], parent=None, token_ids=tokens_of(1) + tokens_of(2), block_size=BS, ts=2
    )
    assert table.orphan_count == 0 and table.hittable_count == 4
    table.remove([2])
    assert table.orphan_count == 1 and table.hittable_count == 1
    assert table.is_hittable(1) and not table.is_hittable(4)


def test_copies_are_counted_and_removed_one_at_a_time() -> None:
    table = BlockTable(GPU0, 0.0)
    for _ in range(3):
        table.store_chain([7], None, tokens_of(7), BS, 1.0)
    assert table.count(7) == 3 and table.copies == 3 and len(table) == 1
    table.remove([7, 7])
    assert table.count(7) == 1
    table.remove([7, 7])
    assert 7 not in table and table.unknown_removals == 1


def test_clear_empties_every_tier_and_group_and_hands_the_map_to_listeners() -> None:
    seen: list[ClearedMap] = []

    class Listener:
        def map_cleared(self, cleared: ClearedMap) -> None:
            seen.append(cleared)

    prefix_map = PrefixMap(StreamId("r", 1), Listener().map_cleared)
    prefix_map.apply(Batch(0, 5.0, 1, [stored([1, 2], None), stored([9], None, CPU0)]))
    prefix_map.apply(Batch(1, 6.0, 1, [AllCleared(), stored([5], None, GPU1)]), epoch=3)
    assert [c.reason for c in seen] == [ClearReason.ALL_BLOCKS_CLEARED]
    before = seen[0]
    assert (before.seq, before.epoch, before.stream) == (1, 3, StreamId("r", 1))
    assert {k: len(t) for k, t in before.tables.items()} == {GPU0: 2, CPU0: 1}
    # What followed the clear in the same batch lands in the new map.
    assert prefix_map.counts() == {(5, 1): 1}


def test_longest_prefix_matches_block_contents_along_the_chain() -> None:
    prefix_map = PrefixMap(StreamId("r", 0))
    prefix_map.apply(
        Batch(
            0,
            1.0,
            0,
            [
                stored([1, 2, 3], None),
                stored([4], 2),  # a branch after block 2
                stored([8, 9], 7),  # an orphan chain: not reachable from block 0
                stored([1, 2], None, CPU0),
            ],
        )
    )
    query = tokens_of(1) + tokens_of(2) + tokens_of(4) + tokens_of(3) + [0, 0]
    matches = {m.table: (m.blocks, m.tokens) for m in prefix_map.longest_prefix(query)}
    assert matches == {GPU0: (3, 12), CPU0: (2, 8)}
    assert prefix_map.longest_prefix(tokens_of(8)) == [
        m for m in prefix_map.longest_prefix(tokens_of(8)) if m.blocks == 0
    ]
    lora = BlocksStored([11], None, tokens_of(1), BS, GPU1, lora_name="adapter")
    prefix_map.apply(Batch(1, 2.0, 0, [lora]))
    by_table = {m.table: m.blocks for m in prefix_map.longest_prefix(tokens_of(1), "adapter")}
    assert by_table[GPU1] == 1 and by_table[GPU0] == 0


@dataclass
class LookupReference(Reference):
    """Also which cached hashes were stored without tokens: no lookup can match those."""

    bare: dict[TableKey, set[int]] = field(default_factory=dict)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, AllCleared):
            self.bare.clear()
        elif isinstance(event, BlocksStored):
            table, bare = self.tables.get(event.table, {}), self.bare.setdefault(event.table, set())
            for h in event.hashes:
                if h not in table:
                    (bare.add if not event.token_ids else bare.discard)(h)
        super().apply(event)

    def prefix(self, key: TableKey, query: list[int]) -> int:
        """Blocks of `query` (hashes, tokens_of each) cached as one chain from a root."""
        table, bare, parent = self.tables.get(key, {}), self.bare.get(key, set()), None
        for depth, h in enumerate(query):
            if h not in table or table[h].parent != parent or h in bare:
                return depth
            parent = h
        return len(query)


def chains(table: dict[int, Entry]) -> list[list[int]]:
    """Every cached block's chain from its root, where it has one: queries that hit deep."""
    found: list[list[int]] = []
    for h in table:
        chain: list[int] = []
        node: int | None = h
        seen: set[int] = set()
        while node is not None and node in table and node not in seen:
            seen.add(node)
            chain.append(node)
            node = table[node].parent
        if node is None:
            found.append(chain[::-1])
    return found


def bare(hashes: list[int], parent: int | None, table: TableKey) -> BlocksStored:
    """Stored without tokens: its slot may still hold an earlier block's tokens."""
    return BlocksStored(list(hashes), parent, [], BS, table)


# Many blocks under few parents: long sibling lists, as after a shared system prompt. Few
# hashes: slots are freed and reused often.
few = st.integers(min_value=0, max_value=5)
few_parents = st.sampled_from([None, 0, 1, 2])
fan_out = st.one_of(
    st.builds(stored, st.lists(few, min_size=1, max_size=3), few_parents, st.just(GPU0)),
    st.builds(bare, st.lists(few, min_size=1, max_size=2), few_parents, st.just(GPU0)),
    st.builds(BlocksRemoved, st.lists(few, min_size=1, max_size=3), st.just(GPU0)),
)
# A child dropped and its slot taken at once by a block stored without tokens.
reuse = st.builds(
    lambda h, g, p: [stored([h], p), BlocksRemoved([h], GPU0), bare([g], p, GPU0)],
    few,
    few,
    few_parents,
)


def check_lookups(prefix_map: PrefixMap, ref: LookupReference, queries: list[list[int]]) -> None:
    for query in queries:
        # A partial last block is never matched: vLLM caches full blocks only.
        tokens = [t for h in query for t in tokens_of(h)] + [7] * (len(query) % BS)
        got = {m.table: (m.blocks, m.tokens) for m in prefix_map.longest_prefix(tokens)}
        want = {key: ref.prefix(key, query) for key in prefix_map.tables}
        assert got == {key: (n, n * BS) for key, n in want.items()}, query


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.lists(st.one_of(fan_out, events), min_size=1, max_size=6), reuse), max_size=25
    ),
    st.lists(st.lists(hashes, max_size=6), max_size=4),
    st.lists(hashes, min_size=1, max_size=2),
)
def test_longest_prefix_agrees_with_the_reference_model(
    batches: list[list[KVEvent]], queries: list[list[int]], tail: list[int]
) -> None:
    ref = LookupReference()
    for prefix_map in applied(batches, ref):
        # Each cached chain, longer, and with each block in place of its last one: siblings,
        # blocks stored elsewhere, blocks stored without tokens over a slot that held others.
        cached = [c for t in ref.tables.values() for c in chains(t)]
        others = [c[:-1] + [h] for c in cached for h in range(6)]
        check_lookups(prefix_map, ref, queries + [c + tail for c in cached] + others)


def test_a_block_stored_without_tokens_never_matches_what_its_slot_held_before() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain([5], None, tokens_of(5), BS, 1.0)
    table.store_chain([6], 5, tokens_of(6), BS, 1.0)
    table.remove([6])
    table.store_chain([7], 5, [], BS, 2.0)  # reuses 6's slot, whose tokens are still there
    assert table.longest_prefix(TokenQuery(tokens_of(5) + tokens_of(6))) == 1
