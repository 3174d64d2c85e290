"""A publisher's whole map as bytes and back, exactly: checkpoints and the "before" of resets.

zstd over msgpack; columns travel as raw array bytes, so encoding is a few memory copies. Format
2 lays each column out as byte planes (collector/_byte_planes.pyx), which zstd packs tighter;
format 3 first drops what the columns repeat (collector/_checkpoint_columns.pyx: parents the
tree already names, slot numbers, last store times equal to the first, token blocks stored once
each). Format 5 also leaves out previous siblings (the next siblings imply them) and may
number token blocks among known ones given by
the caller (a stream's log dictionary's: `KnownBlocks`), which it then names in a header before
the zstd frame, so that a store can keep what its checkpoints name without opening them.
Formats 1 (items as they lie in memory), 2 and 3 are still read, and `recode` turns any into any
other (the store's migrations do).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, NamedTuple

import msgspec
import zstandard

from kvscope.collector._byte_planes import join_planes
from kvscope.collector._checkpoint_columns import intern_records
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import MapReader, TableReader

# The table-state rewrites live in snapshot_columns; those collector/snapshot_delta.py reads
# from here are re-exported (`as`: mypy --strict re-exports no other way).
from kvscope.collector.snapshot_columns import _ARRAYS, _TOKENS
from kvscope.collector.snapshot_columns import _TOKEN_ITEM as _TOKEN_ITEM
from kvscope.collector.snapshot_columns import _as_planes as _as_planes
from kvscope.collector.snapshot_columns import _deduplicated as _deduplicated
from kvscope.collector.snapshot_columns import _from_planes as _from_planes
from kvscope.collector.snapshot_columns import _restored as _restored
from kvscope.collector.token_records import TokenRecords
from kvscope.collector.types import StreamId, TableKey

FORMAT_VERSION = 5
SNAPSHOT_FORMATS = (1, 2, 3, 5)
"""The formats read and written (4 is a delta's, below)."""
DELTA_FORMAT = 4
"""A checkpoint as the rows changed since a key checkpoint (collector/snapshot_delta.py)."""
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_NAMED = b"\x00kvB"
"""Starts a snapshot whose token blocks are partly known ones: then the name's length (a byte),
the name, and the zstd frame."""


class KnownBlocks(NamedTuple):
    """Token blocks a snapshot may number instead of holding (format 5), under a name it keeps.

    Made by `known_blocks`: distinct records, so a block's number is its position."""

    name: bytes
    records: bytes
    record: int
    """Bytes per record: a table of another block size holds its blocks itself."""


def known_blocks(name: bytes, records: bytes, record: int) -> KnownBlocks:
    """`records` (whole records of `record` bytes, uint32 token ids) without repeats, as a
    snapshot's encoder and decoder both number them."""
    if not 0 < len(name) < 256:
        raise ValueError("a name of 1 to 255 bytes, please")
    _, distinct = intern_records(records, record)
    held = bytes(records) if len(distinct) == len(records) else bytes(distinct)  # (no copy)
    return KnownBlocks(name, held, record)


BlocksNamed = Callable[[bytes], KnownBlocks]
"""The known blocks of a name a snapshot gives (a store reads them by it)."""


class SnapshotError(ValueError):
    """Bytes that are not a map snapshot this version can read."""


def encode_tables(
    tables: Mapping[TableKey, TableReader],
    signed: bool = False,
    compressed: bool = True,
    version: int = FORMAT_VERSION,
    known: KnownBlocks | None = None,
) -> bytes:
    """The snapshot; `compressed=False` leaves the zstd step to `compress` (on another thread,
    since zstd runs without the GIL while the map must be copied with it)."""
    # Formats 3 and 5 keep the tokens as distinct blocks: interned from the packed column,
    # unless `known` blocks come first in the numbering (then they are interned with those).
    interned = compressed and version in (3, 5) and known is None
    states = [t.to_state(interned_tokens=interned) for t in tables.values()]
    state_v1 = {"version": 1, "tables": states, "signed": signed}
    if not compressed:
        return msgspec.msgpack.encode(_state_in(state_v1, version, None))
    return _encoded(state_v1, version, known)


def _state_in(state_v1: dict[str, Any], version: int, known: KnownBlocks | None) -> dict[str, Any]:
    """A state of format 1 as format `version`, in place; a format-5 table numbers the blocks
    of `known` (of its record size) and says how many there are as "known"."""
    state_v1["tables"] = [_from_v1(t, version, known) for t in state_v1["tables"]]
    state_v1["version"] = version
    return state_v1


def _from_v1(
    table: dict[str, Any], version: int, known: KnownBlocks | None = None
) -> dict[str, Any]:
    """A table state of format 1 as format `version` (5: numbering `known`'s blocks, where
    they are of its block size, and saying how many as "known")."""
    if version == 1:  # as views: msgpack takes those (and bytes), not the decoder's arrays
        views = {name: memoryview(table[name]) for name in _ARRAYS}
        return {**table, **views, "columns": [memoryview(c) for c in table["columns"]]}
    if version != 5:
        return _as_planes(_deduplicated(table) if version == 3 else table)
    record = table["block_size"] * _TOKEN_ITEM
    held = known.records if known is not None and known.record == record else b""
    state = _deduplicated(table, held, compact=True)
    state["known"] = len(held) // record if state["token_blocks"] is not None else 0
    return _as_planes(state)


def _to_v1(
    table: dict[str, Any],
    version: int,
    as_records: bool = False,
    known: KnownBlocks | None = None,
) -> dict[str, Any]:
    """The inverse of `_from_v1` and `_state_in`; `as_records`: see `_restored`."""
    if version == 1:
        return table
    table = _from_planes(table)
    if version == 2:
        return table
    records = None
    n_known = table.pop("known", 0) if version == 5 else 0
    if n_known:
        if known is None or len(known.records) != n_known * known.record:
            raise SnapshotError("the snapshot numbers known token blocks that were not given")
        own = table["token_blocks"]
        records = known.records + (b"" if own is None else join_planes(own, _TOKEN_ITEM))
    return _restored(table, records, as_records=as_records)


def copy_tables(tables: Mapping[TableKey, TableReader], signed: bool = False) -> bytes:
    """The tables as they are now, for `encode_copy` to make a snapshot of later (on another
    thread, while they change): the cheapest whole copy, format 1 uncompressed."""
    return encode_tables(tables, signed, compressed=False, version=1)


def copy_map(prefix_map: MapReader) -> bytes:
    return copy_tables(prefix_map.tables, prefix_map.signed_hashes)


def encode_copy(
    copy: bytes, version: int = FORMAT_VERSION, known: KnownBlocks | None = None
) -> bytes:
    """The snapshot, compressed, of what `copy_tables` copied: the very bytes `encode_tables`
    made of the tables then. The store's writer thread runs this, off the ingest thread: the
    format's columns are worked out there. Format 5 numbers the blocks of `known` it holds."""
    return _encoded(read_copy(copy), version, known)


def read_copy(copy: bytes) -> dict[str, Any]:
    """What `copy_tables` copied, as its state (format 1), the arrays as views into `copy`:
    none is copied (SnapshotError if it is no copy)."""
    try:
        read = _copy_decoder().decode(copy)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"not a copy of a map: {exc}") from exc
    return {
        "version": read.version,
        "tables": [msgspec.structs.asdict(t) for t in read.tables],
        "signed": read.signed,
    }


@cache
def _copy_decoder() -> msgspec.msgpack.Decoder[Any]:
    """Reads a copy with its arrays as views into it: the map's bytes are not copied again
    before the format's columns are made of them. Its fields are a table state's, in their
    order (so that a snapshot lays them out as `encode_tables` does); one it lacks is refused."""
    sample = BlockTable(TableKey("GPU", 0), 0.0).to_state()
    arrays: dict[str, Any] = {
        name: memoryview for name, value in sample.items() if type(value) is memoryview
    }
    arrays["columns"] = list[memoryview]
    fields = [(name, arrays.get(name, Any)) for name in sample]
    table = msgspec.defstruct("CopiedTable", fields, forbid_unknown_fields=True)
    whole = [("version", int), ("tables", list[table]), ("signed", Any)]  # type: ignore[valid-type]
    return msgspec.msgpack.Decoder(msgspec.defstruct("Copy", whole, forbid_unknown_fields=True))


def _encoded(state_v1: dict[str, Any], version: int, known: KnownBlocks | None = None) -> bytes:
    """A state of format 1 in format `version`, compressed (with its header where a table
    numbers known blocks)."""
    state = _state_in(state_v1, version, known)
    packed = compress(msgspec.msgpack.encode(state))
    if known is None or not any(t.get("known") for t in state["tables"]):
        return packed
    return named_header(len(known.name)) + known.name + packed


def named_header(name_bytes: int) -> bytes:
    """How a snapshot naming known blocks of a name this long starts (the name follows)."""
    return _NAMED + bytes([name_bytes])


def blocks_named(data: bytes) -> bytes | None:
    """The name of the known blocks a snapshot numbers, if any (read without decompressing)."""
    if data[:4] != _NAMED or len(data) < 5:
        return None
    return bytes(data[5 : 5 + data[4]])


def _body(data: bytes) -> bytes:
    """The zstd (or zlib) frame, past a header."""
    name = blocks_named(data)
    return data if name is None else data[5 + len(name) :]


def compress(raw: bytes) -> bytes:
    """zstd, level 3: smaller and faster than the zlib that snapshots were written with before."""
    # A zstd (de)compressor object must not be shared between threads (it crashes): one per call.
    return zstandard.ZstdCompressor(level=3).compress(raw)


def _decompress(data: bytes) -> bytes:
    if data[:4] == _ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().decompress(data)
    return zlib.decompress(data)  # snapshots written before zstd


def _state(data: bytes, formats: tuple[int, ...] = SNAPSHOT_FORMATS) -> dict[str, Any]:
    """A snapshot's state, of any of `formats`, as written."""
    try:
        state = msgspec.msgpack.decode(_decompress(_body(data)))
    except (zlib.error, zstandard.ZstdError, msgspec.DecodeError) as exc:
        raise SnapshotError(f"not a map snapshot: {exc}") from exc
    if not isinstance(state, dict) or state.get("version") not in formats:
        version = state.get("version") if isinstance(state, dict) else None
        if version == DELTA_FORMAT:
            raise SnapshotError("a delta checkpoint: it is read with its key")
        raise SnapshotError("unknown map snapshot version")
    return state


def _state_v1(
    data: bytes, as_records: bool = False, blocks: BlocksNamed | None = None
) -> dict[str, Any]:
    state = _state(data)
    version = state["version"]
    name = blocks_named(data)
    known = None
    if name is not None:
        if blocks is None:
            raise SnapshotError(f"the snapshot numbers the known blocks {name.hex()}: give them")
        known = blocks(name)
    state["tables"] = [_to_v1(t, version, as_records, known) for t in state["tables"]]
    state["version"] = 1
    return state


def snapshot_version(data: bytes) -> int:
    return int(_state(data)["version"])


NOT_WHOLE = (KeyError, IndexError, TypeError, ValueError, AttributeError)
"""What a snapshot that decodes but lacks or mistypes a part raises on the way to a map."""


def recode(data: bytes, version: int, blocks: BlocksNamed | None = None) -> bytes:
    """A snapshot re-written in format `version`, compressed (the map itself is not rebuilt);
    `blocks` gives the known blocks it may name (it is then written holding them)."""
    if version not in SNAPSHOT_FORMATS:
        raise SnapshotError(f"no map snapshot format {version}")
    try:
        return _encoded(_state_v1(data, blocks=blocks), version)
    except NOT_WHOLE as exc:
        raise SnapshotError(f"not a whole map snapshot: {exc!r}") from exc


def decode_tables(
    data: bytes, blocks: BlocksNamed | None = None
) -> tuple[dict[TableKey, BlockTable], bool]:
    """The tables and whether the publisher sends signed hashes; `blocks` gives the known
    blocks a format-5 snapshot may name."""
    try:
        return _tables_of(_state_v1(data, as_records=True, blocks=blocks))
    except NOT_WHOLE as exc:
        raise SnapshotError(f"not a whole map snapshot: {exc!r}") from exc


def decode_copy(copy: bytes) -> tuple[dict[TableKey, BlockTable], bool]:
    """`decode_tables` of what `copy_tables` copied (format 1, uncompressed): the same tables
    as from a snapshot `encode_copy` made of it, without that snapshot's compression."""
    try:
        return _tables_of(msgspec.msgpack.decode(copy))
    except (msgspec.DecodeError, *NOT_WHOLE) as exc:
        raise SnapshotError(f"not a copy of a map: {exc!r}") from exc


def _tables_of(state: dict[str, Any]) -> tuple[dict[TableKey, BlockTable], bool]:
    tables = {}
    for table_state in state["tables"]:
        table = table_from_state(table_state)
        tables[table.key] = table
    return tables, bool(state.get("signed"))


def table_from_state(state: dict[str, Any]) -> BlockTable:
    """`BlockTable.from_state`, where the tokens column may be `TokenRecords`: each distinct
    block is packed once and copied to its slots, the same column as from the blocks expanded."""
    tokens = state["columns"][_TOKENS]
    if type(tokens) is not TokenRecords:
        return BlockTable.from_state(state)
    columns = list(state["columns"])
    columns[_TOKENS] = b""
    table = BlockTable.from_state({**state, "columns": columns})
    table._token_column.assign_records(table.block_size, tokens.numbers, tokens.records)
    return table


def encode_map(
    prefix_map: MapReader,
    compressed: bool = True,
    version: int = FORMAT_VERSION,
    known: KnownBlocks | None = None,
) -> bytes:
    return encode_tables(prefix_map.tables, prefix_map.signed_hashes, compressed, version, known)


def decode_map(data: bytes, stream: StreamId, blocks: BlocksNamed | None = None) -> PrefixMap:
    tables, signed = decode_tables(data, blocks)
    prefix_map = PrefixMap(stream)
    prefix_map.tables = tables
    prefix_map.counters.signed_hashes = signed
    return prefix_map
