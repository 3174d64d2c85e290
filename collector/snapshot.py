"""A publisher's whole map as bytes and back, exactly: checkpoints and the "before" of resets.

zlib over msgpack; columns travel as raw array bytes, so encoding is a few memory copies.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import MapCounters, MapListener, PrefixMap
from kvscope.collector.types import StreamId, TableKey

FORMAT_VERSION = 1


class SnapshotError(ValueError):
    """Bytes that are not a map snapshot this version can read."""


def encode_tables(
    tables: Mapping[TableKey, BlockTable], counters: MapCounters | None = None
) -> bytes:
    state: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "tables": [table.to_state() for table in tables.values()],
        "signed": bool(counters and counters.signed_hashes),
    }
    return zlib.compress(msgspec.msgpack.encode(state), 1)


def decode_tables(data: bytes) -> tuple[dict[TableKey, BlockTable], bool]:
    """The tables and whether the publisher sends signed hashes."""
    try:
        state = msgspec.msgpack.decode(zlib.decompress(data))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise SnapshotError(f"not a map snapshot: {exc}") from exc
    if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
        raise SnapshotError("unknown map snapshot version")
    tables = {}
    for table_state in state["tables"]:
        table = BlockTable.from_state(table_state)
        tables[table.key] = table
    return tables, bool(state.get("signed"))


def encode_map(prefix_map: PrefixMap) -> bytes:
    return encode_tables(prefix_map.tables, prefix_map.counters)


def decode_map(data: bytes, stream: StreamId, listeners: Iterable[MapListener] = ()) -> PrefixMap:
    tables, signed = decode_tables(data)
    prefix_map = PrefixMap(stream, listeners)
    prefix_map.tables = tables
    prefix_map.counters.signed_hashes = signed
    return prefix_map
