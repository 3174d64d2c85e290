"""Delta checkpoints (snapshot format 4): a map as the slot rows changed since a key checkpoint.

A key is a format-3 snapshot. A delta holds, per table, a bitmap of the slot rows that differ
from the key's (format 3's rows: each slot's hash, its columns with parents XORed and token
blocks numbered), those rows only, the token blocks the key does not hold, and the table's
small parts whole. Reading one takes its key and the delta, never a chain: the map it gives
equals, byte for byte, the one the delta was made from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from kvscope.collector._byte_planes import join_planes
from kvscope.collector._checkpoint_rows import gather, mark_changed, scatter
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import (
    _TOKEN_ITEM,
    DELTA_FORMAT,
    NOT_WHOLE,
    SnapshotError,
    _as_planes,
    _deduplicated,
    _from_planes,
    _restored,
    _state,
    compress,
    table_from_state,
)
from kvscope.collector.types import StreamId

_KEY_FORMAT = 3
_ROWS = "rows"
"""A delta table's slot count; "changed" its bitmap, "row_widths" each array's row size."""


@dataclass(frozen=True)
class Key:
    """What a delta is made against: each table's format-3 state (before byte planes) and its
    distinct token blocks, by (medium, group)."""

    tables: dict[tuple[str, int], tuple[dict[str, Any], bytes]]


def _table_id(table: dict[str, Any]) -> tuple[str, int]:
    return (table["medium"], table["group"])


def _keyed(table: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    blocks = table["token_blocks"]
    records = b"" if blocks is None else bytes(join_planes(blocks, _TOKEN_ITEM))
    return table, records


def encode_key(copy: bytes) -> tuple[bytes, Key]:
    """A format-3 snapshot of what `copy_tables` copied, and the key deltas are made against."""
    state = msgspec.msgpack.decode(copy)
    tables = [_deduplicated(t) for t in state["tables"]]
    state["tables"] = [_as_planes(t) for t in tables]
    state["version"] = _KEY_FORMAT
    packed = compress(msgspec.msgpack.encode(state))
    return packed, Key({_table_id(t): _keyed(t) for t in tables})


def _per_slot(table: dict[str, Any]) -> list[Any]:
    """A format-3 table's arrays of one row per slot: the hashes, then the columns."""
    return [table["hashes"], *table["columns"]]


def encode_delta(copy: bytes, key: Key) -> bytes | None:
    """A format-4 snapshot of what `copy_tables` copied, against `key`; None where a delta
    cannot say it (a table the key lacks or holds otherwise): write a key instead."""
    state = msgspec.msgpack.decode(copy)
    tables = []
    for table in state["tables"]:
        held = key.tables.get(_table_id(table))
        if held is None or held[0]["block_size"] != table["block_size"]:
            return None
        delta = _table_delta(table, *held)
        if delta is None:
            return None
        tables.append(delta)
    state["tables"] = tables
    state["version"] = DELTA_FORMAT
    return compress(msgspec.msgpack.encode(state))


def _table_delta(table: dict[str, Any], key: dict[str, Any], records: bytes) -> Any:
    if key["token_blocks"] is None:
        return None
    now = _deduplicated(table, records)
    if now["token_blocks"] is None:
        return None
    rows, key_rows = _bytes(now["hashes"]).nbytes // 8, _bytes(key["hashes"]).nbytes // 8
    pairs = list(zip(_per_slot(key), _per_slot(now), strict=True))
    widths = [_width(k, a, key_rows, rows) for k, a in pairs]
    if None in widths:
        return None
    changed = bytearray((rows + 7) // 8)
    for key_array, array, width in zip(_per_slot(key), _per_slot(now), widths, strict=True):
        if width:
            mark_changed(_baseline(key_array, width, key_rows), _bytes(array), width, changed)
    hashes, *columns = (
        gather(_bytes(a), changed, w) if w else b""
        for a, w in zip(_per_slot(now), widths, strict=True)
    )
    delta = {**now, "hashes": hashes, "columns": columns}
    return {**_as_planes(delta), _ROWS: rows, "changed": bytes(changed), "row_widths": widths}


def _width(key_array: Any, array: Any, key_rows: int, rows: int) -> int | None:
    """Bytes per row of an array of one row per slot, the same in the key and now (0: an
    array left empty in both); None where they are not whole rows of one width."""
    size, key_size = memoryview(array).nbytes, memoryview(key_array).nbytes
    if not size and not key_size:
        return 0
    if not rows or not key_rows or size % rows or key_size % key_rows:
        return None
    width = size // rows
    return width if key_size in (0, width * key_rows) else None


def _baseline(key_array: Any, width: int, key_rows: int) -> memoryview:
    """The key's array to compare rows with: zeros where the key had none yet (a column that
    is made on first use), as both sides take it."""
    data = _bytes(key_array)
    return data if data.nbytes else memoryview(bytes(width * key_rows))


def _bytes(data: Any) -> memoryview:
    return memoryview(data).cast("B")


def decode_delta(data: bytes, key_data: bytes) -> tuple[dict[Any, BlockTable], bool]:
    """The tables a delta holds, read with its key, and whether the hashes are signed."""
    try:
        delta = _state(data, (DELTA_FORMAT,))
        key = _state(key_data, (_KEY_FORMAT,))
        held = {_table_id(t): t for t in key["tables"]}
        tables = {}
        for table_state in delta["tables"]:
            key_table = _from_planes(held[_table_id(table_state)])
            state, records = _applied(_from_planes(table_state), key_table)
            table = table_from_state(_restored(state, records, as_records=True))
            tables[table.key] = table
    except NOT_WHOLE as exc:
        raise SnapshotError(f"not a whole delta checkpoint and key: {exc!r}") from exc
    return tables, bool(delta.get("signed"))


def _applied(delta: dict[str, Any], key: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The format-3 table (before planes) that `delta` makes of `key`, and its token blocks."""
    rows, changed, widths = delta.pop(_ROWS), delta.pop("changed"), delta.pop("row_widths")
    key_rows = _bytes(key["hashes"]).nbytes // 8
    hashes, *columns = (
        scatter(_baseline(k, w, key_rows), _bytes(d), changed, w, rows) if w else b""
        for k, d, w in zip(_per_slot(key), _per_slot(delta), widths, strict=True)
    )
    key_blocks, own = key["token_blocks"], delta["token_blocks"]
    records = bytes(join_planes(key_blocks, _TOKEN_ITEM)) + bytes(join_planes(own, _TOKEN_ITEM))
    return {**delta, "hashes": hashes, "columns": columns}, records


def decode_delta_map(data: bytes, key_data: bytes, stream: StreamId) -> PrefixMap:
    tables, signed = decode_delta(data, key_data)
    prefix_map = PrefixMap(stream)
    prefix_map.tables = tables
    prefix_map.counters.signed_hashes = signed
    return prefix_map
