"""A misused `FusedApply` (collector/_replay.pyx) says so and is left usable: the reader is
shared by every stream of an ingest (and a fleet's router), so one that stayed busy would send
every later batch of every stream the slow way, decoded."""

from __future__ import annotations

import pytest

from kvscope.collector._replay import FusedApply
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import StreamId
from kvscope.storage.log_dictionary import GRANULE
from tests.test_log_dictionary import payload, stored

STREAM = StreamId("a", 0)


def batch(first_hash: int) -> bytes:
    return payload([stored(list(range(GRANULE)), [first_hash])])


def test_apply_prepared_with_none_prepared_leaves_the_reader_free() -> None:
    reader, prefix_map = FusedApply(), PrefixMap(STREAM)
    max_block_size = prefix_map.limits.max_block_size
    assert reader.prepare(prefix_map, batch(1), 0, False, 1.0, max_block_size) is not None
    # The held batch's read overwritten (a route_read between prepare and apply_prepared):
    # nothing is prepared any more.
    assert reader.route_read((5).to_bytes(8, "big"), b"not a batch", max_block_size) == -1
    with pytest.raises(RuntimeError, match="no batch prepared"):
        reader.apply_prepared(1, {})
    with pytest.raises(RuntimeError, match="no batch prepared"):
        reader.apply_prepared(1, {})  # and again, with nothing held at all
    taken = reader.taken
    assert reader.live(prefix_map, batch(2), 2, 0, False, 2.0, max_block_size) >= 0
    assert reader.taken == taken + 1
    assert reader.prepare(prefix_map, batch(3), 0, False, 3.0, max_block_size) is not None
    assert reader.apply_prepared(3, {}) >= 0
    assert reader.taken == taken + 2
