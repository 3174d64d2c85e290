"""A publisher's whole map as bytes and back, exactly: checkpoints and the "before" of resets.

zstd over msgpack; columns travel as raw array bytes, so encoding is a few memory copies.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import msgspec
import zstandard

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import MapReader, TableReader
from kvscope.collector.types import StreamId, TableKey

FORMAT_VERSION = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class SnapshotError(ValueError):
    """Bytes that are not a map snapshot this version can read."""


def encode_tables(
    tables: Mapping[TableKey, TableReader], signed: bool = False, compressed: bool = True
) -> bytes:
    """The snapshot; `compressed=False` leaves the zstd step to `compress` (on another thread,
    since zstd runs without the GIL while the map must be copied with it)."""
    state: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "tables": [table.to_state() for table in tables.values()],
        "signed": signed,
    }
    raw = msgspec.msgpack.encode(state)
    return compress(raw) if compressed else raw


def compress(raw: bytes) -> bytes:
    """zstd, level 3: smaller and faster than the zlib that snapshots were written with before."""
    # A zstd (de)compressor object must not be shared between threads (it crashes): one per call.
    return zstandard.ZstdCompressor(level=3).compress(raw)


def _decompress(data: bytes) -> bytes:
    if data[:4] == _ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().decompress(data)
    return zlib.decompress(data)  # snapshots written before zstd


def decode_tables(data: bytes) -> tuple[dict[TableKey, BlockTable], bool]:
    """The tables and whether the publisher sends signed hashes."""
    try:
        state = msgspec.msgpack.decode(_decompress(data))
    except (zlib.error, zstandard.ZstdError, msgspec.DecodeError) as exc:
        raise SnapshotError(f"not a map snapshot: {exc}") from exc
    if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
        raise SnapshotError("unknown map snapshot version")
    tables = {}
    for table_state in state["tables"]:
        table = BlockTable.from_state(table_state)
        tables[table.key] = table
    return tables, bool(state.get("signed"))


def encode_map(prefix_map: MapReader, compressed: bool = True) -> bytes:
    return encode_tables(prefix_map.tables, prefix_map.signed_hashes, compressed)


def decode_map(data: bytes, stream: StreamId) -> PrefixMap:
    tables, signed = decode_tables(data)
    prefix_map = PrefixMap(stream)
    prefix_map.tables = tables
    prefix_map.counters.signed_hashes = signed
    return prefix_map
