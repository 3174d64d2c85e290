"""Delta checkpoints (format 4) read with their key give back the map they were made from, byte
for byte, and evolve the same; read without it they are refused."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvscope.collector._checkpoint_rows import gather, mark_changed, scatter
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import SnapshotError, copy_map, decode_map, encode_map
from kvscope.collector.snapshot_delta import decode_delta_map, encode_delta, encode_key
from kvscope.collector.types import Batch, KVEvent, StreamId
from tests.test_prefix_map import events, stored
from tests.test_snapshot import columns_of, state_of

STREAM = StreamId("r", 0)


def _key_and_delta(
    before: list[KVEvent], after: list[KVEvent]
) -> tuple[PrefixMap, bytes, bytes | None]:
    """A map after `before` and `after` (the key taken between them: its table exists from the
    start, as a delta needs), the key and the delta (None where a key must be written: a table
    the key lacks, or emptied by a clear)."""
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 10.0, 0, [stored([1 << 40], None), *before]))
    key_data, key = encode_key(copy_map(prefix_map))
    prefix_map.apply(Batch(1, 11.0, 0, after))
    return prefix_map, key_data, encode_delta(copy_map(prefix_map), key)


@settings(max_examples=150, deadline=None)
@given(st.lists(events, max_size=40), st.lists(events, max_size=30), st.lists(events, max_size=10))
def test_a_delta_read_with_its_key_is_the_map_and_evolves_the_same(
    before: list[KVEvent], after: list[KVEvent], later: list[KVEvent]
) -> None:
    original, key_data, delta = _key_and_delta(before, after)
    assume(delta is not None)
    assert delta is not None
    restored = decode_delta_map(delta, key_data, STREAM)
    assert state_of(restored) == state_of(original)
    assert restored.tables.keys() == original.tables.keys()
    for key, table in original.tables.items():
        assert columns_of(restored.tables[key]) == columns_of(table)
    original.apply(Batch(2, 12.0, 0, later))
    restored.apply(Batch(2, 12.0, 0, later))
    assert state_of(restored) == state_of(original)


def test_a_key_is_a_format_3_snapshot_of_the_map() -> None:
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored(list(range(1, 50)), None)]))
    key_data, _ = encode_key(copy_map(prefix_map))
    assert key_data == encode_map(prefix_map, version=3)


def test_a_delta_holds_only_the_rows_changed_and_new_token_blocks() -> None:
    blocks = random.Random(0).sample(range(1, 1 << 62), 2000)
    original, key_data, delta = _key_and_delta(
        [stored(blocks, None)], [stored([5000], blocks[-1]), stored([5001], blocks[7])]
    )
    assert delta is not None
    assert len(delta) < len(key_data) / 10
    assert state_of(decode_delta_map(delta, key_data, STREAM)) == state_of(original)


def test_a_delta_without_its_key_or_with_another_is_refused() -> None:
    _, key_data, delta = _key_and_delta([stored([1, 2, 3], None)], [stored([4], 3)])
    assert delta is not None
    with pytest.raises(SnapshotError, match="delta"):
        decode_map(delta, STREAM)
    with pytest.raises(SnapshotError):
        decode_delta_map(delta, delta, STREAM)
    with pytest.raises(SnapshotError):
        decode_delta_map(key_data, key_data, STREAM)


def test_a_table_the_key_lacks_makes_no_delta() -> None:
    from kvscope.collector.types import TableKey

    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored([1], None)]))
    _, key = encode_key(copy_map(prefix_map))
    prefix_map.apply(Batch(1, 2.0, 0, [stored([2], None, TableKey("CPU", 0))]))
    assert encode_delta(copy_map(prefix_map), key) is None


@given(
    st.lists(st.tuples(st.binary(min_size=8, max_size=8), st.booleans()), max_size=40),
    st.sampled_from([1, 3, 4, 8]),
    st.floats(0, 1),
)
def test_rows_gathered_and_scattered_go_there_and_back(
    rows: list[tuple[bytes, bool]], width: int, kept: float
) -> None:
    """Whatever the width, and a key as long as now or shorter (its missing rows changed)."""
    key = b"".join(row[:width] for row, _ in rows[: int(len(rows) * kept)])
    now = b"".join(
        row[:width] if keep else key[i * width : (i + 1) * width] or bytes(width)
        for i, (row, keep) in enumerate(rows)
    )
    changed = bytearray((len(rows) + 7) // 8)
    mark_changed(key, now, width, changed)
    assert bytes(scatter(key, gather(now, changed, width), changed, width, len(rows))) == now
