"""A map's fields that the fused path reads in C (collector/_map_core.pyx)."""

from __future__ import annotations

import msgspec

from kvscope.collector._map_core import MapCore
from kvscope.collector._replay import replay
from kvscope.collector.limits import IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import StreamId, TableKey

STREAM = StreamId("r", 0)
STORED = msgspec.msgpack.encode(
    [1.0, [["BlockStored", [11, 12], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU", None]], None]
)


def test_a_prefix_map_keeps_its_read_fields_in_c() -> None:
    prefix_map = PrefixMap(STREAM)
    assert isinstance(prefix_map, MapCore)
    tables: dict[TableKey, object] = {}
    prefix_map.tables = tables  # type: ignore[assignment]
    assert prefix_map.tables is tables
    assert "tables" not in vars(prefix_map)


def test_the_fused_path_reads_the_fields_as_python_set_them() -> None:
    """Tables and limits replaced from Python are the ones a fused batch goes to and meets."""
    prefix_map = PrefixMap(STREAM)
    first: dict[TableKey, object] = {}
    prefix_map.tables = first  # type: ignore[assignment]
    prefix_map.limits = IngestLimits(max_block_size=16)
    assert replay(prefix_map, [(0, STORED)], 0) == 1
    assert prefix_map.tables is first and prefix_map.totals().blocks == 2
    assert prefix_map.counters.batches == 1 and prefix_map.counters.stored_blocks == 2
