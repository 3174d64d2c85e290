"""A publisher's whole map as bytes and back, exactly: checkpoints and the "before" of resets.

zstd over msgpack; columns travel as raw array bytes, so encoding is a few memory copies. Format
2 lays each column out as byte planes (collector/_byte_planes.pyx), which zstd packs tighter;
format 1 (items as they lie in memory) is still read, and `recode` turns one into the other
(the store's migration does).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from functools import cache
from typing import Any

import msgspec
import zstandard

from kvscope.collector._byte_planes import join_planes, split_planes
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import MapReader, TableReader
from kvscope.collector.types import StreamId, TableKey

FORMAT_VERSION = 2
SNAPSHOT_FORMATS = (1, 2)
"""The formats read and written."""
_ARRAYS = ("hashes", "slots", "free")
"""A table state's array fields besides its `columns`."""
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class SnapshotError(ValueError):
    """Bytes that are not a map snapshot this version can read."""


def encode_tables(
    tables: Mapping[TableKey, TableReader],
    signed: bool = False,
    compressed: bool = True,
    version: int = FORMAT_VERSION,
) -> bytes:
    """The snapshot; `compressed=False` leaves the zstd step to `compress` (on another thread,
    since zstd runs without the GIL while the map must be copied with it)."""
    table_states = [table.to_state() for table in tables.values()]
    if version == 2:
        table_states = [_as_planes(t) for t in table_states]
    state: dict[str, Any] = {"version": version, "tables": table_states, "signed": signed}
    raw = msgspec.msgpack.encode(state)
    return compress(raw) if compressed else raw


def _as_planes(table: dict[str, Any]) -> dict[str, Any]:
    """A table state of format 1 as format 2: each array as byte planes, its width beside it."""
    flat = [memoryview(a).cast("B") for a in (*(table[n] for n in _ARRAYS), *table["columns"])]
    widths = [_width(len(a), size) for a, size in zip(flat, _item_sizes(), strict=True)]
    planes = [a if w == 1 else split_planes(a, w) for a, w in zip(flat, widths, strict=True)]
    return {
        **table,
        **dict(zip(_ARRAYS, planes, strict=False)),
        "columns": planes[len(_ARRAYS) :],
        "widths": widths,
    }


@cache
def _item_sizes() -> tuple[int, ...]:
    """The item size of each of a table state's arrays (`_ARRAYS`, then its columns): a state
    read back from msgpack has only bytes, so the sizes come from the table itself."""
    table = BlockTable(TableKey("GPU", 0), 0.0)
    sizes = {"hashes": 8, "slots": 4, "free": 4}
    return (
        *(sizes[name] for name in _ARRAYS),
        *(getattr(table, name).itemsize for name in BlockTable._COLUMNS),
    )


def _width(size: int, item_size: int) -> int:
    """Planes of `item_size` when the bytes are whole items of it (a column written with a
    narrower type is not): any width goes back exactly, the item's packs best."""
    return item_size if size % item_size == 0 else 1


def _from_planes(table: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `_as_planes`."""
    widths = table.pop("widths")
    planes = [table[name] for name in _ARRAYS] + list(table["columns"])
    arrays = [p if w == 1 else join_planes(p, w) for p, w in zip(planes, widths, strict=True)]
    return {
        **table,
        **dict(zip(_ARRAYS, arrays, strict=False)),
        "columns": arrays[len(_ARRAYS) :],
    }


def compress(raw: bytes) -> bytes:
    """zstd, level 3: smaller and faster than the zlib that snapshots were written with before."""
    # A zstd (de)compressor object must not be shared between threads (it crashes): one per call.
    return zstandard.ZstdCompressor(level=3).compress(raw)


def _decompress(data: bytes) -> bytes:
    if data[:4] == _ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().decompress(data)
    return zlib.decompress(data)  # snapshots written before zstd


def _state(data: bytes) -> dict[str, Any]:
    """A snapshot's state, of either format, as written."""
    try:
        state = msgspec.msgpack.decode(_decompress(data))
    except (zlib.error, zstandard.ZstdError, msgspec.DecodeError) as exc:
        raise SnapshotError(f"not a map snapshot: {exc}") from exc
    if not isinstance(state, dict) or state.get("version") not in SNAPSHOT_FORMATS:
        raise SnapshotError("unknown map snapshot version")
    return state


def _state_v1(data: bytes) -> dict[str, Any]:
    state = _state(data)
    if state["version"] == 2:
        state["tables"] = [_from_planes(t) for t in state["tables"]]
        state["version"] = 1
    return state


def snapshot_version(data: bytes) -> int:
    return int(_state(data)["version"])


NOT_WHOLE = (KeyError, IndexError, TypeError, ValueError, AttributeError)
"""What a snapshot that decodes but lacks or mistypes a part raises on the way to a map."""


def recode(data: bytes, version: int) -> bytes:
    """A snapshot re-written in format `version`, compressed (the map itself is not rebuilt)."""
    if version not in SNAPSHOT_FORMATS:
        raise SnapshotError(f"no map snapshot format {version}")
    try:
        state = _state_v1(data)
        if version == 2:
            state["tables"] = [_as_planes(t) for t in state["tables"]]
    except NOT_WHOLE as exc:
        raise SnapshotError(f"not a whole map snapshot: {exc!r}") from exc
    state["version"] = version
    return compress(msgspec.msgpack.encode(state))


def decode_tables(data: bytes) -> tuple[dict[TableKey, BlockTable], bool]:
    """The tables and whether the publisher sends signed hashes."""
    try:
        state = _state_v1(data)
        tables = {}
        for table_state in state["tables"]:
            table = BlockTable.from_state(table_state)
            tables[table.key] = table
    except NOT_WHOLE as exc:
        raise SnapshotError(f"not a whole map snapshot: {exc!r}") from exc
    return tables, bool(state.get("signed"))


def encode_map(
    prefix_map: MapReader, compressed: bool = True, version: int = FORMAT_VERSION
) -> bytes:
    return encode_tables(prefix_map.tables, prefix_map.signed_hashes, compressed, version)


def decode_map(data: bytes, stream: StreamId) -> PrefixMap:
    tables, signed = decode_tables(data)
    prefix_map = PrefixMap(stream)
    prefix_map.tables = tables
    prefix_map.counters.signed_hashes = signed
    return prefix_map
