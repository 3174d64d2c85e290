"""Snapshots restore a map exactly: same blocks, links, hittability, and later changes agree."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._byte_planes import join_planes, split_planes
from kvscope.collector._checkpoint_columns import (
    by_slot,
    expand_records,
    from_slots,
    intern_records,
    minus,
    xor_linked_parents,
)
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import (
    FORMAT_VERSION,
    SNAPSHOT_FORMATS,
    SnapshotError,
    compress,
    copy_map,
    decode_copy,
    decode_map,
    decode_tables,
    encode_copy,
    encode_map,
    recode,
    snapshot_version,
)
from kvscope.collector.types import Batch, BlocksStored, KVEvent, StreamId
from tests.test_prefix_map import events, stored

STREAM = StreamId("r", 0)


def state_of(prefix_map: PrefixMap) -> object:
    return {
        key: (
            table.counts(),
            {e.hash: (e.parent, e.hittable, e.token_ids, e.lora_name) for e in table.entries()},
            table.stats(),
        )
        for key, table in prefix_map.tables.items()
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(events, max_size=40), st.lists(events, max_size=20))
def test_a_restored_map_is_the_same_and_evolves_the_same(
    before: list[KVEvent], after: list[KVEvent]
) -> None:
    original = PrefixMap(STREAM)
    original.apply(Batch(0, 10.0, 0, before))
    restored = decode_map(encode_map(original), STREAM)
    assert state_of(restored) == state_of(original)
    original.apply(Batch(1, 11.0, 0, after))
    restored.apply(Batch(1, 11.0, 0, after))
    assert state_of(restored) == state_of(original)


def test_odd_blocks_lora_and_bytes_hashes_survive() -> None:
    prefix_map = PrefixMap(STREAM)
    event = BlocksStored(
        [5, 6],
        None,
        list(range(8)),
        4,
        stored([1], None).table,
        lora_name="a",
        extra_keys=[("a",), ("a", "salt")],
        raw_hashes=[b"\x05" * 32, b"\x06" * 32],
    )
    prefix_map.apply(Batch(0, 1.0, 0, [event, stored([9], 6)]))
    prefix_map.counters.signed_hashes = True
    restored = decode_map(encode_map(prefix_map), STREAM)
    assert state_of(restored) == state_of(prefix_map)
    assert restored.counters.signed_hashes
    table = next(iter(restored.tables.values()))
    assert table.raw_hash(6) == b"\x06" * 32


@settings(max_examples=100, deadline=None)
@given(st.lists(events, max_size=40), st.lists(events, max_size=20), st.booleans())
def test_a_copy_encoded_later_is_the_snapshot_of_the_instant_it_was_taken(
    before: list[KVEvent], after: list[KVEvent], signed: bool
) -> None:
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 10.0, 0, before))
    prefix_map.counters.signed_hashes = signed
    then, state_then = encode_map(prefix_map), state_of(prefix_map)
    copy = copy_map(prefix_map)
    prefix_map.apply(Batch(1, 11.0, 0, after))  # the map moves on before the copy is encoded
    assert encode_copy(copy) == then
    first = encode_copy(copy, version=1)
    assert snapshot_version(first) == 1 and state_of(decode_map(first, STREAM)) == state_then


def test_garbage_is_refused() -> None:
    with pytest.raises(SnapshotError):
        decode_map(b"nope", STREAM)


def test_snapshots_pack_from_several_threads_at_once() -> None:
    """Two store writers compress checkpoints concurrently (a shared zstd object crashed)."""
    import threading

    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored(list(range(1, 400)), None)]))
    raw = encode_map(prefix_map, compressed=False)
    errors: list[BaseException] = []

    def pack_many() -> None:
        try:
            for _ in range(200):
                assert state_of(decode_map(compress(raw), STREAM)) == state_of(prefix_map)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pack_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _many_blocks() -> PrefixMap:
    prefix_map = PrefixMap(STREAM)
    for root in range(50):
        hashes = list(range(root * 1000 + 1, root * 1000 + 41))
        prefix_map.apply(Batch(root, 1.0 + root, 0, [stored(hashes, None)]))
    return prefix_map


def test_snapshots_are_written_in_the_last_format_and_read_in_every_one() -> None:
    prefix_map = _many_blocks()
    written = {version: encode_map(prefix_map, version=version) for version in SNAPSHOT_FORMATS}
    assert snapshot_version(encode_map(prefix_map)) == FORMAT_VERSION == 5
    assert [snapshot_version(written[v]) for v in SNAPSHOT_FORMATS] == [1, 2, 3, 5]
    assert len(written[3]) < len(written[2]) < len(written[1])  # 5 pays on real maps
    for data in written.values():
        assert state_of(decode_map(data, STREAM)) == state_of(prefix_map)


def test_a_snapshot_recoded_to_any_format_restores_the_same_map() -> None:
    prefix_map = _many_blocks()
    for start in SNAPSHOT_FORMATS:
        data = encode_map(prefix_map, version=start)
        for version in SNAPSHOT_FORMATS:
            recoded = recode(data, version)
            assert snapshot_version(recoded) == version
            assert state_of(decode_map(recoded, STREAM)) == state_of(prefix_map)


def columns_of(table: BlockTable) -> object:
    """A table's arrays byte for byte: what a checkpoint must give back whatever it leaves out."""
    columns = [getattr(table, name).tobytes() for name in BlockTable._COLUMNS]
    return dict(table._slot_of.items()), columns, table._free, table._high


@settings(max_examples=150, deadline=None)
@given(st.lists(events, max_size=40), st.lists(events, max_size=20))
def test_formats_2_3_and_5_decode_to_the_same_columns(
    before: list[KVEvent], after: list[KVEvent]
) -> None:
    """Parents, slot numbers, store times and previous siblings left out and token blocks
    stored once come back byte for byte, also where a removal left free slots, stale tokens
    and orphans behind."""
    original = PrefixMap(STREAM)
    original.apply(Batch(0, 10.0, 0, before))
    original.apply(Batch(1, 11.0, 0, after))
    for version in (2, 3, 5):
        decoded = decode_map(encode_map(original, version=version), STREAM)
        assert decoded.tables.keys() == original.tables.keys()
        for key, table in original.tables.items():
            assert columns_of(decoded.tables[key]) == columns_of(table), version


@given(st.lists(st.binary(min_size=8, max_size=8), max_size=40))
def test_records_interned_go_there_and_back(records: list[bytes]) -> None:
    data = b"".join(records)
    numbers, distinct = intern_records(data, 8)
    assert len(distinct) == 8 * len(set(records)) and len(numbers) == len(records)
    assert expand_records(numbers, distinct, 8).tobytes() == data


def test_linked_parents_xored_twice_are_the_same() -> None:
    """Each block under a cached parent is named by that parent's child list: format 3 keeps
    0 for it, and the same XOR gives the parent back."""
    from array import array

    from kvscope.collector._table_core import HAS_PARENT

    table = _many_blocks().tables[next(iter(_many_blocks().tables))]
    hashes, slots = table._slot_of.to_arrays()
    links = (hashes, slots, table._first_child, table._next_sibling)
    xored = xor_linked_parents(table._parent.tobytes(), *links)
    linked = [s for s in range(len(table._parent)) if table._flags[s] & HAS_PARENT]
    assert linked and all(xored[s] == 0 for s in linked)  # the tree names each of them
    assert xor_linked_parents(xored.tobytes(), *links) == table._parent
    assert isinstance(xored, array)


def test_slot_maps_and_differences_go_there_and_back() -> None:
    from array import array

    hash_of_slot, present = by_slot(array("Q", [5, 2**64 - 1]), array("i", [9, 0]), 10)
    assert list(hash_of_slot) == [2**64 - 1, *[0] * 8, 5] and len(present) == 2
    assert from_slots(hash_of_slot, present) == (array("Q", [2**64 - 1, 5]), array("i", [0, 9]))
    with pytest.raises(ValueError):
        by_slot(array("Q", [5, 6]), array("i", [1, 1]), 10)  # one slot, two hashes
    first, last = array("I", [7, 2**32 - 1]), array("I", [3, 0])  # even a time going back
    assert minus(minus(last, first), first, inverse=True) == last


def _v3_state(version: int = 3) -> dict[str, Any]:
    import msgspec

    data = encode_map(_many_blocks(), compressed=False, version=version)
    state: dict[str, Any] = msgspec.msgpack.decode(data)
    assert state["version"] == version and state["tables"][0]["token_blocks"]
    return state


def _columns_set_to(version: int = 3, **columns: bytes) -> dict[str, Any]:
    state = _v3_state(version)
    table = state["tables"][0]
    for name, fill in columns.items():
        at = BlockTable._COLUMNS.index(name)
        table["columns"][at] = fill * (len(table["columns"][at]) // len(fill))
    return state


@pytest.mark.parametrize(
    "state",
    [
        _columns_set_to(_tokens=b"\xff"),  # token blocks past the distinct ones
        _columns_set_to(_first_child=b"\x00", _next_sibling=b"\x00"),  # child lists in a cycle
        _columns_set_to(_first_child=b"\x7f"),  # a child past the columns
        {**_v3_state(), "tables": [{**_v3_state()["tables"][0], "token_blocks": b"\x00" * 5}]},
        {**_v3_state(), "tables": [{**_v3_state()["tables"][0], "block_size": 0}]},
        {**_v3_state(), "tables": [{**_v3_state()["tables"][0], "present": b"\xff"}]},
        {**_v3_state(), "tables": [{**_v3_state()["tables"][0], "present": None}]},
        _columns_set_to(5, _first_child=b"\x00", _next_sibling=b"\x00"),
        _columns_set_to(5, _next_sibling=b"\x7f"),
        {**_v3_state(5), "tables": [{**_v3_state(5)["tables"][0], "implied": ["later"]}]},
        {**_v3_state(5), "tables": [{**_v3_state(5)["tables"][0], "known": 3}]},
    ],
    ids=[
        "token-number",
        "cycle",
        "child-out-of-range",
        "token-blocks-cut",
        "no-block-size",
        "slots-cut",
        "no-slots",
        "5-cycle",
        "5-sibling-out-of-range",
        "5-unknown-rewrite",
        "5-known-blocks-not-given",
    ],
)
def test_a_format_3_or_5_snapshot_that_lies_is_refused(state: dict[str, Any]) -> None:
    import msgspec

    data = compress(msgspec.msgpack.encode(state))
    with pytest.raises(SnapshotError):
        decode_map(data, STREAM)
    with pytest.raises(SnapshotError):
        recode(data, 2)


@given(st.binary(max_size=64), st.sampled_from([1, 2, 4, 8]))
def test_byte_planes_go_there_and_back(data: bytes, width: int) -> None:
    data = data[: len(data) - len(data) % width]
    split = split_planes(data, width)
    assert sorted(split) == sorted(data) and join_planes(split, width) == data


@given(st.binary(max_size=256), st.sampled_from([1, 2, 3, 4, 8]))
def test_byte_planes_are_each_items_bytes_in_turn(data: bytes, width: int) -> None:
    data = data[: len(data) - len(data) % width]
    planes = b"".join(data[p::width] for p in range(width))
    assert split_planes(data, width) == planes


@pytest.mark.parametrize(
    "state",
    [
        {"version": 1, "tables": [{"hashes": b""}]},  # a table without its arrays
        {"version": 2, "tables": [{"widths": [1]}]},  # planes without their arrays
        {"version": 1, "tables": 7},
        {"version": 2, "tables": [{"hashes": b"", "slots": b"", "free": b"", "widths": [8]}]},
    ],
)
def test_a_snapshot_that_decodes_but_is_not_whole_is_refused(state: dict[str, Any]) -> None:
    """A store's corrupt snapshot is refused as one (SnapshotError), whatever part is missing:
    migration 0010 leaves such a row as it is instead of stopping on it."""
    import msgspec

    data = compress(msgspec.msgpack.encode(state))
    with pytest.raises(SnapshotError):
        recode(data, 3 - state["version"])  # into the other format
    with pytest.raises(SnapshotError):
        decode_map(data, STREAM)


@settings(max_examples=100, deadline=None)
@given(st.lists(events, max_size=40), st.booleans())
def test_a_copy_decodes_to_the_tables_its_snapshot_holds(
    before: list[KVEvent], signed: bool
) -> None:
    """What the store's writer holds of a reset's `before` map is read without its snapshot."""
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 10.0, 0, before))
    prefix_map.counters.signed_hashes = signed
    copy = copy_map(prefix_map)
    tables, copy_signed = decode_copy(copy)
    from_snapshot, snapshot_signed = decode_tables(encode_copy(copy))
    as_map = PrefixMap(STREAM)
    as_map.tables = tables
    expected = PrefixMap(STREAM)
    expected.tables = from_snapshot
    assert state_of(as_map) == state_of(expected) == state_of(prefix_map)
    assert copy_signed == snapshot_signed == signed


def test_a_copy_that_is_no_map_is_refused() -> None:
    with pytest.raises(SnapshotError):
        decode_copy(b"\x81\xa6tables\x01")
    with pytest.raises(SnapshotError):
        decode_copy(b"\xc1")
