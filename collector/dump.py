"""The map as jsonl lines: one per (hash, medium, group), in a stable order.

`{"hash": ..., "group": ..., "medium": "GPU", "count": ..., "parent": ..., "hittable": ...}`.
Hashes are ints as vLLM sends them (signed for publishers that send signed ints), or hex
strings for publishers that send bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap

_SIGN_BIT = 1 << 63


def show_hash(value: int, raw: bytes | None, signed: bool) -> int | str:
    if raw is not None:
        return raw.hex()
    if signed and value & _SIGN_BIT:
        return value - (1 << 64)
    return value


def table_lines(table: BlockTable, signed: bool) -> Iterator[dict[str, object]]:
    key = table.key
    for entry in sorted(table.entries(), key=lambda e: e.hash):
        parent = entry.parent
        yield {
            "hash": show_hash(entry.hash, entry.raw_hash, signed),
            "group": key.group,
            "medium": key.medium,
            "count": entry.count,
            "parent": None
            if parent is None
            else show_hash(parent, table.raw_parent(entry.hash), signed),
            "hittable": entry.hittable,
        }


def map_lines(prefix_map: PrefixMap) -> Iterator[dict[str, object]]:
    signed = prefix_map.counters.signed_hashes
    for _, table in sorted(prefix_map.tables.items(), key=lambda kv: (kv[0].medium, kv[0].group)):
        yield from table_lines(table, signed)


def write_dump(prefix_map: PrefixMap, path: Path) -> int:
    encoder = msgspec.json.Encoder()
    n = 0
    with path.open("wb") as f:
        for line in map_lines(prefix_map):
            f.write(encoder.encode(line) + b"\n")
            n += 1
    return n
