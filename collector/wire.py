"""vLLM's KV event payloads, every layout from 0.9 to 0.33, decoded into domain events.

The structs below mirror the wire; past `decode_batch` no code sees msgpack shapes.

Two event layouts exist: tagged arrays (`["BlockStored", hashes, parent, ...]`, vLLM <= 0.23)
and tagged maps (`{"type": "BlockStored", ...}`, vLLM >= 0.24). A typed decoder for one fails on
the other, so each is tried in turn (the one that worked last first). When neither typed decoder
accepts a batch (an unknown event type, a field of the wrong type), the batch is decoded
generically and converted event by event, so one bad event costs only itself.

Before all that, `_wire_fast.decode_map_batch` (compiled) tries the common case, a vLLM >= 0.24
map-layout batch of well-typed fields, and declines anything else to the path above.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.types import (
    HASH_MASK,
    MEDIUM_GPU,
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    TableKey,
)

WireHash = int | bytes


# --- tagged maps (vLLM >= 0.24) ---------------------------------------------------------------
class MapBlockStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    block_hashes: list[WireHash]
    parent_block_hash: WireHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class MapBlockRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    block_hashes: list[WireHash]
    medium: str | None = None
    group_idx: int | None = None


class MapAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


class MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[MapBlockStored | MapBlockRemoved | MapAllBlocksCleared]
    data_parallel_rank: int | None = None  # absent in 0.9.0


# --- tagged arrays (vLLM 0.9 - 0.23); each release sent a prefix of these fields ---------------
class ArrayBlockStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    block_hashes: list[WireHash]
    parent_block_hash: WireHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None  # 0.10.2
    lora_name: str | None = None  # 0.14.0
    extra_keys: list[Any] | None = None  # 0.17.0
    group_idx: int | None = None  # 0.20.0


class ArrayBlockRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    block_hashes: list[WireHash]
    medium: str | None = None
    group_idx: int | None = None


class ArrayAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared]
    data_parallel_rank: int | None = None


_TYPED_DECODERS: tuple[msgspec.msgpack.Decoder[Any], ...] = (
    msgspec.msgpack.Decoder(MapBatch),
    msgspec.msgpack.Decoder(ArrayBatch),
)
_MAP_DECODER = _TYPED_DECODERS[0]
_GENERIC_DECODER = msgspec.msgpack.Decoder()

_table_keys: dict[tuple[str, int], TableKey] = {}


def table_key(medium: str | None, group: int | None) -> TableKey:
    """The interned key of a (medium, group) table; medium None (vLLM < 0.10.2) means GPU."""
    k = (medium or MEDIUM_GPU, group or 0)
    key = _table_keys.get(k)
    if key is None:
        key = _table_keys[k] = TableKey(*k)
    return key


def hash_from_wire(value: object) -> int:
    """One block hash in vLLM's unsigned int form, whatever form it travelled in."""
    if type(value) is int:
        return value & HASH_MASK
    if type(value) is bytes and value:
        return int.from_bytes(value, "big") & HASH_MASK
    raise MalformedPayload(MalformedKind.BAD_EVENT, f"not a block hash: {value!r:.40}")


def hashes_from_wire(values: list[Any]) -> tuple[list[int], list[bytes] | None, bool]:
    """The hashes in int form, the raw bytes when they travelled as bytes, and whether any
    was a negative int (vLLM < 0.10.2 sent Python's signed `hash()`)."""
    if not values:
        return values, None, False
    try:
        # The common case (vLLM >= 0.10.2 defaults): unsigned ints, passed through uncopied.
        if min(values) >= 0 and max(values) <= HASH_MASK:
            return values, None, False
    except TypeError:
        pass  # bytes, or a mix: convert one by one
    raw = [v for v in values if type(v) is bytes]
    signed = any(type(v) is int and v < 0 for v in values)
    ints = [hash_from_wire(v) for v in values]
    return ints, (raw if len(raw) == len(values) else None), signed


class _Converter:
    """Turns typed wire structs, or generic msgpack values, into domain events."""

    @staticmethod
    def stored(
        hashes: list[Any],
        parent: object,
        token_ids: list[int],
        block_size: int,
        medium: str | None,
        group: int | None,
        lora_name: str | None,
        extra_keys: list[Any] | None,
    ) -> BlocksStored:
        ints, raw, signed = hashes_from_wire(hashes)
        parent_int = None if parent is None else hash_from_wire(parent)
        signed = signed or (type(parent) is int and parent < 0)
        if extra_keys is not None and extra_keys.count(None) == len(extra_keys):
            extra_keys = None  # vLLM >= 0.17 sends one None per block: no extra keys
        return BlocksStored(
            hashes=ints,
            parent=parent_int,
            token_ids=token_ids,
            block_size=block_size,
            table=table_key(medium, group),
            lora_name=lora_name,
            extra_keys=extra_keys,
            raw_hashes=raw,
            raw_parent=parent if type(parent) is bytes else None,
            signed_hashes=signed,
        )

    @staticmethod
    def removed(hashes: list[Any], medium: str | None, group: int | None) -> BlocksRemoved:
        return BlocksRemoved(hashes_from_wire(hashes)[0], table_key(medium, group))


_NO_KEY = TableKey("", -1)
"""No table's key: what `_from_typed` starts from."""


def _from_typed(wire_events: list[Any]) -> list[KVEvent]:
    """The domain events of a typed batch, converted and merged (as `_merge_removals` merges) in
    one pass: the ingest hot path.

    Raises `MalformedPayload` for a hash the typed decoders let through (an empty bytes).
    """
    events: list[KVEvent] = []
    append = events.append
    removal: BlocksRemoved | None = None  # the last event, when it is a removal
    # The interned key of the last (medium, group) seen: a batch's events mostly share one.
    medium: object = _NO_KEY
    group: object = _NO_KEY
    key = _NO_KEY
    for event in wire_events:
        kind = type(event)
        if kind is MapBlockRemoved or kind is ArrayBlockRemoved:
            if event.medium != medium or event.group_idx != group:
                medium, group = event.medium, event.group_idx
                key = table_key(event.medium, event.group_idx)
            hashes = event.block_hashes
            # The common cases (vLLM >= 0.10.2 defaults): unsigned ints, used uncopied; vLLM
            # sends one hash per removal.
            if len(hashes) == 1:
                first = hashes[0]
                if type(first) is not int or not 0 <= first <= HASH_MASK:
                    hashes = hashes_from_wire(hashes)[0]
            else:
                try:
                    if hashes and not (min(hashes) >= 0 and max(hashes) <= HASH_MASK):
                        hashes = hashes_from_wire(hashes)[0]
                except TypeError:  # bytes, or a mix
                    hashes = hashes_from_wire(hashes)[0]
            if removal is not None and removal.table is key:
                removal.hashes.extend(hashes)  # the lists are fresh from the decoder
            else:
                removal = BlocksRemoved(hashes, key)
                append(removal)
            continue
        removal = None
        if kind is MapBlockStored or kind is ArrayBlockStored:
            if event.medium != medium or event.group_idx != group:
                medium, group = event.medium, event.group_idx
                key = table_key(event.medium, event.group_idx)
            hashes, parent = event.block_hashes, event.parent_block_hash
            try:
                plain = not hashes or (min(hashes) >= 0 and max(hashes) <= HASH_MASK)
            except TypeError:
                plain = False
            if plain and (parent is None or (type(parent) is int and 0 <= parent <= HASH_MASK)):
                # What `_Converter.stored` makes of unsigned int hashes, built directly.
                extra_keys = event.extra_keys
                if extra_keys is not None and extra_keys.count(None) == len(extra_keys):
                    extra_keys = None
                append(
                    BlocksStored(
                        hashes,
                        parent,
                        event.token_ids,
                        event.block_size,
                        key,
                        event.lora_name,
                        extra_keys,
                    )
                )
            else:
                append(
                    _Converter.stored(
                        hashes,
                        parent,
                        event.token_ids,
                        event.block_size,
                        event.medium,
                        event.group_idx,
                        event.lora_name,
                        event.extra_keys,
                    )
                )
        else:
            append(AllCleared())
    return events


def _merge_removals(events: list[KVEvent]) -> list[KVEvent]:
    """Join consecutive removals from one table into one event.

    vLLM sends one `BlockRemoved` per evicted hash; applying them as one list is the same change
    (removals commute with each other) at a fraction of the per-event cost.
    """
    merged: list[KVEvent] = []
    for event in events:
        if type(event) is BlocksRemoved and merged:
            last = merged[-1]
            if type(last) is BlocksRemoved and last.table == event.table:
                last.hashes.extend(event.hashes)  # the lists are fresh from the decoder
                continue
        merged.append(event)
    return merged


# Positional field names of the array layout, in order after the tag.
_ARRAY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _fields_of(raw: object) -> tuple[str, dict[str, Any]]:
    """The tag and fields of one generically decoded event, map or array layout."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, list | tuple) and raw:
        tag = raw[0]
        names = _ARRAY_FIELDS.get(tag) if isinstance(tag, str) else None
        fields = dict(zip(names or (), raw[1:], strict=False))
    else:
        raise MalformedPayload(MalformedKind.BAD_EVENT, f"event is a {type(raw).__name__}")
    if tag not in _ARRAY_FIELDS:
        raise MalformedPayload(MalformedKind.UNKNOWN_EVENT_TYPE, f"event type {tag!r:.40}")
    return tag, fields


def _typed(fields: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = fields.get(name, default)
    if value is not None and not isinstance(value, kind):
        raise MalformedPayload(MalformedKind.BAD_EVENT, f"{name} is a {type(value).__name__}")
    return value


def _from_generic(raw: object) -> KVEvent:
    tag, f = _fields_of(raw)
    if tag == "AllBlocksCleared":
        return AllCleared()
    hashes = _typed(f, "block_hashes", list, None)
    if hashes is None:
        raise MalformedPayload(MalformedKind.BAD_EVENT, "block_hashes missing")
    # The typed decoders check hash types; here it is ours to do before the int fast path.
    for value in hashes:
        if type(value) is not int and type(value) is not bytes:
            raise MalformedPayload(MalformedKind.BAD_EVENT, f"not a block hash: {value!r:.40}")
    medium = _typed(f, "medium", str, None)
    group = _typed(f, "group_idx", int, None)
    if tag == "BlockRemoved":
        return _Converter.removed(hashes, medium, group)
    token_ids = _typed(f, "token_ids", list, [])
    if not all(type(t) is int for t in token_ids):
        raise MalformedPayload(MalformedKind.BAD_EVENT, "token_ids must be ints")
    return _Converter.stored(
        hashes,
        f.get("parent_block_hash"),
        token_ids,
        _typed(f, "block_size", int, 0),
        medium,
        group,
        _typed(f, "lora_name", str, None),
        _typed(f, "extra_keys", list, None),
    )


class BatchDecoder:
    """Decodes payloads of one stream; remembers which layout the stream speaks.

    `errors` receives one `MalformedPayload` per event that had to be dropped; the rest of the
    batch is still returned.
    """

    def __init__(self) -> None:
        self._order = list(_TYPED_DECODERS)

    def decode(
        self, payload: bytes, seq: int, errors: list[MalformedPayload] | None = None
    ) -> Batch:
        batch = decode_map_batch(payload, seq)
        if batch is None:
            return self._decode_slow(payload, seq, errors)
        if self._order[0] is not _MAP_DECODER:  # the stream speaks the map layout (again)
            self._order.remove(_MAP_DECODER)
            self._order.insert(0, _MAP_DECODER)
        return batch

    def _decode_slow(
        self, payload: bytes, seq: int, errors: list[MalformedPayload] | None = None
    ) -> Batch:
        """Every layout and every error: what the compiled fast path declines."""
        for i, decoder in enumerate(self._order):
            try:
                wire = decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            except Exception:
                continue
            if i:
                self._order.insert(0, self._order.pop(i))
            try:
                events = _from_typed(wire.events)
            except MalformedPayload:
                break  # a bad hash inside a typed event: sort it out event by event below
            return Batch(seq, wire.ts, wire.data_parallel_rank, events)
        return self._decode_generic(payload, seq, errors)

    @staticmethod
    def _decode_generic(payload: bytes, seq: int, errors: list[MalformedPayload] | None) -> Batch:
        try:
            outer = _GENERIC_DECODER.decode(payload)
        except (msgspec.DecodeError, ValueError) as exc:
            raise MalformedPayload(MalformedKind.UNDECODABLE, str(exc)) from exc
        if not isinstance(outer, list) or len(outer) < 2 or not isinstance(outer[1], list):
            raise MalformedPayload(MalformedKind.UNDECODABLE, "not a [ts, events, ...] batch")
        ts, raw_events = outer[0], outer[1]
        rank = outer[2] if len(outer) > 2 else None
        if not isinstance(ts, int | float) or not (rank is None or type(rank) is int):
            raise MalformedPayload(MalformedKind.UNDECODABLE, "bad batch ts or rank")
        events: list[KVEvent] = []
        dropped = 0
        for raw in raw_events:
            try:
                events.append(_from_generic(raw))
            except MalformedPayload as exc:
                dropped += 1
                if errors is not None:
                    errors.append(exc)
        return Batch(seq, float(ts), rank, _merge_removals(events), dropped_events=dropped)
