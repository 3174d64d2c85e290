"""The map against a plain reference model, and the behaviours vLLM's BlockPool implies."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import ClearedMap, ClearReason, PrefixMap
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
class Reference:
    """The obvious model: per table, hash -> [copies, parent]."""

    tables: dict[TableKey, dict[int, list[int | None]]] = field(default_factory=dict)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, AllCleared):
            self.tables.clear()
        elif isinstance(event, BlocksStored):
            table = self.tables.setdefault(event.table, {})
            parent = event.parent
            for h in event.hashes:
                if h in table:
                    table[h][0] += 1  # type: ignore[operator]
                else:
                    table[h] = [1, parent]
                parent = h
        else:
            table = self.tables.setdefault(event.table, {})
            for h in event.hashes:
                if h in table:
                    table[h][0] -= 1  # type: ignore[operator]
                    if table[h][0] == 0:
                        del table[h]

    def hittable(self, key: TableKey) -> set[int]:
        table = self.tables.get(key, {})
        out = set()
        for h in table:
            seen = set()
            node: int | None = h
            while node is not None and node in table and node not in seen:
                seen.add(node)
                node = table[node][1]  # type: ignore[assignment]
            if node is None:
                out.add(h)
        return out

    def orphans(self, key: TableKey) -> int:
        table = self.tables.get(key, {})
        return sum(1 for _, parent in table.values() if parent is not None and parent not in table)


def check_against(prefix_map: PrefixMap, ref: Reference) -> None:
    keys = {k for k, t in ref.tables.items() if t} | {k for k, t in prefix_map.tables.items() if t}
    for key in keys:
        table = prefix_map.tables.get(key)
        want = ref.tables.get(key, {})
        got = table.counts() if table is not None else {}
        assert got == {h: c for h, (c, _) in want.items()}, key
        if table is None:
            continue
        for h, (_, parent) in want.items():
            assert table.parent_of(h) == parent
        hittable = ref.hittable(key)
        assert {h for h in got if table.is_hittable(h)} == hittable
        assert table.hittable_count == len(hittable)
        assert table.orphan_count == ref.orphans(key)
        assert table.copies == sum(c for c, _ in want.values())  # type: ignore[misc]


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


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(events, min_size=1, max_size=6), max_size=30))
def test_map_agrees_with_the_reference_model(batches: list[list[KVEvent]]) -> None:
    prefix_map = PrefixMap(StreamId("r", 0))
    ref = Reference()
    for seq, batch_events in enumerate(batches):
        prefix_map.apply(Batch(seq, 1000.0 + seq, 0, batch_events))
        for event in batch_events:
            ref.apply(event)
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

    prefix_map = PrefixMap(StreamId("r", 1), [Listener()])
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
