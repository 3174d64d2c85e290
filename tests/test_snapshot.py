"""Snapshots restore a map exactly: same blocks, links, hittability, and later changes agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import SnapshotError, compress, decode_map, encode_map
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
