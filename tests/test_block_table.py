"""A table's storage: copy counts that never wrap, memory that follows the blocks stored, and
slots that keep nothing of the block they held before."""

from __future__ import annotations

import gc
import tracemalloc
from array import array

import msgspec

from kvscope.collector.block_table import BlockTable, TableStats
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import decode_map, encode_map
from kvscope.collector.token_query import TokenQuery
from kvscope.collector.types import Batch, BlocksStored, StreamId, TableKey

GPU0 = TableKey("GPU", 0)
MAX_COPIES = 2**32 - 1


def test_copies_count_past_a_uint16_and_saturate_at_a_uint32() -> None:
    table = BlockTable(GPU0, 0.0)
    # vLLM's kv_cache_report_mode="full" re-sends BlockStored for every prefix hit.
    table.store_chain([7] * 70_000, None, [], 0, 1.0)
    assert table.count(7) == 70_000 and table.copies == 70_000
    table._count[table._slot_of[7]] = MAX_COPIES - 1  # as after four billion hits
    table.copies = MAX_COPIES - 1
    table.store_chain([7, 7, 7], None, [], 0, 2.0)
    assert table.count(7) == MAX_COPIES  # held there: no wrap to 0 or 1
    assert table.copies == MAX_COPIES
    assert table.saturated_stores == 2
    table.remove([7])
    assert table.count(7) == MAX_COPIES - 1


def test_a_checkpoint_with_uint16_counts_restores_them() -> None:
    prefix_map = PrefixMap(StreamId("r", 0))
    tokens = list(range(8))
    stored = BlocksStored([5, 6], None, tokens, 4, GPU0)
    prefix_map.apply(Batch(0, 1.0, 0, [stored, stored, stored]))
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(prefix_map.tables[GPU0].to_state()))
    state["columns"][0] = array("H", array("I", state["columns"][0])).tobytes()
    table = BlockTable.from_state(state)
    assert table.counts() == {5: 3, 6: 3}
    table.store_chain([5], None, tokens[:4], 4, 2.0)
    assert table.count(5) == 4


def test_the_tokens_column_grows_with_the_blocks_stored_not_ahead_of_them() -> None:
    # Hybrid models have blocks of thousands of tokens: room for GROW_MIN of them ahead of
    # use (what the columns of a new table reserve) would be gigabytes.
    block_size = 16_384
    tracemalloc.start()
    try:
        table = BlockTable(GPU0, 0.0)
        table.store_chain([1], None, array("I", range(block_size)), block_size, 1.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert table.entry(1).token_ids == tuple(range(block_size))
    assert peak < 8 * 2**20
    assert table.token_bytes() <= 2 * 2**20
    # It still grows by a share of itself, not a block at a time.
    for h in range(2, 200):
        table.store_chain([h], h - 1, array("I", [h] * block_size), block_size, 1.0)
    assert table.token_bytes() < 2 * 200 * block_size * 4
    assert table.longest_prefix(TokenQuery(list(range(block_size)) + [2] * block_size)) == 2


def test_a_reused_slot_keeps_nothing_of_the_block_it_held() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain([1], None, [1, 2, 3, 4], 4, 1.0)
    table.store_chain([2], 1, [9, 9], 2, 1.0)  # a partial block: tokens of another size
    table.store_chain([3], 1, [5, 5, 5, 5], 4, 1.0, lora_name="adapter")
    table.store_chain([4], 1, [6, 6, 6, 6], 4, 1.0, raw_hashes=[b"\x04" * 32], raw_parent=b"p")
    table.remove([2, 3, 4])  # leaves under a cached parent: their slots are reused next
    for h in (5, 6, 7):
        table.store_chain([h], 1, [h] * 4, 4, 2.0)
    for h in (5, 6, 7):
        entry = table.entry(h)
        assert entry.token_ids == (h,) * 4 and entry.lora_name is None
        assert table.raw_parent(h) is None
    assert table.longest_prefix(TokenQuery([1, 2, 3, 4, 6, 6, 6, 6])) == 2
    assert table.side_bytes == 0


def test_the_odd_blocks_tokens_are_counted_and_restored() -> None:
    prefix_map = PrefixMap(StreamId("r", 0))
    partial = BlocksStored([2], 1, [9, 9, 9], 3, GPU0)
    prefix_map.apply(Batch(0, 1.0, 0, [BlocksStored([1], None, [1, 2, 3, 4], 4, GPU0), partial]))
    table = prefix_map.tables[GPU0]
    assert table.side_bytes == 12
    restored = decode_map(encode_map(prefix_map), StreamId("r", 0)).tables[GPU0]
    assert restored.side_bytes == 12 and restored.entry(2).token_ids == (9, 9, 9)
    restored.remove([2])
    assert restored.side_bytes == 0


def test_a_maps_totals_are_no_work_for_the_garbage_collector() -> None:
    """The store asks for them after every batch while a reset recovers: one object each time,
    which the cyclic GC need never walk."""
    key = TableKey("GPU", 0)
    pmap = PrefixMap(StreamId("r", 0))
    pmap.apply(Batch(0, 1.0, None, [BlocksStored([1, 2, 3], None, [], 0, key)]))
    totals = pmap.totals()
    assert totals == TableStats(blocks=3, copies=3, hittable=3, orphans=0)
    assert not gc.is_tracked(totals)


def test_token_ids_as_bytes_are_read_as_the_ints_they_hold() -> None:
    # bytes are a Sequence[int]: each byte one token id, not four bytes of one (array("I", b)
    # would take them as raw items, a quarter as many, and the store read past them).
    tokens = bytes(range(1, 33))
    prefix_map = PrefixMap(StreamId("r", 0))
    prefix_map.apply(Batch(0, 1.0, 0, [BlocksStored([1, 2], None, tokens, 16, GPU0)]))
    table = prefix_map.tables[GPU0]
    assert table.entry(1).token_ids == tuple(range(1, 17))
    assert table.entry(2).token_ids == tuple(range(17, 33))
    table.store_chain([3], 2, bytearray([7] * 16), 16, 2.0)
    assert table.entry(3).token_ids == (7,) * 16


def test_in_a_table_is_a_cached_hash_only() -> None:
    # `in` is the compiled core's (collector/_table_core.pyx): what no uint64 can be is absent.
    table = BlockTable(GPU0, 0.0)
    table.store_chain([1, 2, 2**64 - 1], None, [], 1, 1.0)
    table.remove([2])
    assert [h in table for h in (1, 2, 2**64 - 1, 3)] == [True, False, True, False]
    assert -1 not in table and 2**64 not in table and "1" not in table  # type: ignore[operator]
