"""The writer's encoding of a checkpoint copy: known blocks interned once, arrays read in place."""

from __future__ import annotations

import ctypes
from array import array

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector._checkpoint_columns import aligned, intern_records, same_bytes
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import (
    SnapshotError,
    _encoded,
    copy_map,
    encode_copy,
    encode_map,
    read_copy,
)
from kvscope.collector.types import Batch, StreamId
from tests.test_prefix_map import stored

STREAM = StreamId("e", 0)

records8 = st.lists(st.binary(min_size=8, max_size=8), max_size=30)


@given(records8, records8)
def test_records_interned_after_known_ones_number_as_if_joined(
    known: list[bytes], records: list[bytes]
) -> None:
    """Known records (distinct) come first in the numbering and are not given back."""
    held = b"".join(dict.fromkeys(known))
    data = b"".join(records)
    joined_numbers, joined = intern_records(held + data, 8)
    numbers, distinct = intern_records(data, 8, held)
    assert numbers == joined_numbers[len(held) // 8 :]
    assert distinct.tobytes() == joined.tobytes()[len(held) :]


def test_known_records_must_be_distinct_whole_records() -> None:
    with pytest.raises(ValueError):
        intern_records(b"a" * 8, 8, b"b" * 16)
    with pytest.raises(ValueError):
        intern_records(b"a" * 8, 8, b"b" * 9)


def _address(buffer: bytearray, start: int) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer)) + start


def test_a_view_is_kept_where_aligned_and_copied_where_not() -> None:
    buffer = bytearray(range(64))
    for start in range(16):
        view = memoryview(buffer)[start : start + 40]
        got = aligned(view, 8)
        assert bytes(got) == bytes(view)
        assert (got is view) == (_address(buffer, start) % 8 == 0)


def test_same_bytes() -> None:
    assert same_bytes(b"abc", memoryview(b"xabc")[1:])
    assert not same_bytes(b"abc", b"abd") and not same_bytes(b"abc", b"ab")
    assert same_bytes(memoryview(array("i", [1, -1])).cast("B"), array("i", [1, -1]).tobytes())


def _copy_with_extra_field() -> bytes:
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored([1, 2, 3], None)]))
    state = msgspec.msgpack.decode(copy_map(prefix_map))
    state["tables"][0]["surprise"] = 1
    return msgspec.msgpack.encode(state)


def test_a_copy_with_a_field_tables_lack_is_refused() -> None:
    """A copy is read by the table state's fields: one it does not know is not dropped."""
    with pytest.raises(SnapshotError):
        encode_copy(_copy_with_extra_field())


def test_a_copy_read_in_place_at_any_offset_encodes_as_read_copied() -> None:
    """Arrays read in place from the copy lie at any offset in it: the snapshot is the one its
    arrays read as copies make."""
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored(list(range(1, 40)), None)]))
    state = msgspec.msgpack.decode(copy_map(prefix_map))
    assert encode_copy(copy_map(prefix_map)) == encode_map(prefix_map)
    for pad in range(8):
        state["tables"][0]["medium"] = "GPU" + " " * pad
        shifted = msgspec.msgpack.encode(state)
        assert encode_copy(shifted) == _encoded(msgspec.msgpack.decode(shifted), 5)


def test_a_copy_is_read_with_its_arrays_in_place() -> None:
    """The writer reads a checkpoint's copy twice (its hashes, its snapshot): never copying it."""
    prefix_map = PrefixMap(STREAM)
    prefix_map.apply(Batch(0, 1.0, 0, [stored([1, 2, 3], None)]))
    copy = copy_map(prefix_map)
    (table,) = read_copy(copy)["tables"]
    assert table["hashes"].obj is copy and all(c.obj is copy for c in table["columns"])
    assert read_copy(copy) == msgspec.msgpack.decode(copy)
