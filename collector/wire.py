"""vLLM's KV event payloads, every layout from 0.9 to 0.33, decoded into domain events.

The structs below mirror the wire; past `BatchDecoder.decode` no code sees msgpack shapes.

Two event layouts exist: tagged arrays (`["BlockStored", hashes, parent, ...]`, vLLM <= 0.23)
and tagged maps (`{"type": "BlockStored", ...}`, vLLM >= 0.24). One converter per layout builds
the domain events:
- `_wire_fast.decode_map_batch` (compiled) takes the common case, a vLLM >= 0.24 map-layout
  batch of well-typed fields, straight from its bytes, and declines anything else;
- `_Converter` takes what msgspec decodes: the typed decoders (each layout is tried in turn, the
  one that worked last first) or, when neither accepts the batch (an unknown event type, a
  field of the wrong type), the generic decoder, event by event.
Both check every field by the rules of `wire_rules.py`: a known event that breaks one refuses
the whole batch (`MalformedPayload`), nothing of it applied. An unknown event type (a later
vLLM's) is counted and skipped; unknown fields are skipped.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from kvscope.collector import wire_rules as rules
from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.limits import DEFAULT_LIMITS, IngestLimits
from kvscope.collector.types import (
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
    cache_salt: str | None = None  # SGLang's


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
MAP_LAYOUT: Final = _MAP_DECODER
"""`BatchDecoder.layouts`' first while a stream speaks the map layout."""
_GENERIC_DECODER = msgspec.msgpack.Decoder()

MAX_INTERNED_KEYS = 1024
"""Table keys interned for good (a real collector sees a few dozen); past that, new keys are
made per event: equal, only not identical, so a hostile publisher's keys are not kept."""
_table_keys: dict[tuple[str, int], TableKey] = {}
MEDIUM_ALIASES = {"CPU_PINNED": "CPU"}
"""Media that are another engine's name for a kvscope tier: SGLang's pinned host memory is
vLLM's CPU tier. SGLang's DISK and EXTERNAL stay tiers of their own."""


def table_key(medium: str | None, group: int | None) -> TableKey:
    """The interned key of a (medium, group) table; medium None (vLLM < 0.10.2) means GPU.

    The hot paths compare keys with `is`; both fields have passed `wire_rules` first."""
    medium = medium or MEDIUM_GPU
    k = (MEDIUM_ALIASES.get(medium, medium), group or 0)
    key = _table_keys.get(k)
    if key is None:
        key = TableKey(*k)
        if len(_table_keys) < MAX_INTERNED_KEYS:
            _table_keys[k] = key
    return key


class _Converter:
    """Wire fields to domain events, each field checked by `wire_rules`: what the typed and the
    generic decodes share. `typed`: msgspec has made hashes ints or bytes, and tokens ints."""

    def __init__(self, limits: IngestLimits) -> None:
        self.max_block_size = limits.max_block_size

    def stored(
        self,
        hashes: object,
        parent: object,
        token_ids: object,
        block_size: object,
        lora_id: object,
        medium: object,
        lora_name: object,
        extra_keys: object,
        group: object,
        typed: bool,
        cache_salt: object = None,
    ) -> BlocksStored:
        """`cache_salt` (SGLang's, per page) joins each block's extra keys, where vLLM puts a
        request's salt: a salted block is then no lookup's hit, in either engine's map."""
        ints, raw, signed = rules.hashes_of(hashes, typed)
        n = len(ints)
        extra = rules.extra_keys_of(extra_keys, n)
        salt = rules.short_str(cache_salt, "cache_salt", rules.MAX_LORA_NAME_BYTES)
        if salt is not None:
            extra = [[salt, *(entry or [])] for entry in extra or [None] * n]
        size = rules.block_size_of(block_size, self.max_block_size)
        rules.lora_id_ok(lora_id)
        return BlocksStored(
            hashes=ints,
            parent=rules.parent_of(parent),
            token_ids=rules.token_ids_of(token_ids, size, n, typed),
            block_size=size,
            table=table_key(
                rules.short_str(medium, "medium", rules.MAX_MEDIUM_BYTES), rules.group_of(group)
            ),
            lora_name=rules.short_str(lora_name, "lora_name", rules.MAX_LORA_NAME_BYTES),
            extra_keys=extra,
            raw_hashes=raw,
            raw_parent=parent if type(parent) is bytes else None,
            signed_hashes=signed or (type(parent) is int and parent < 0),
        )

    def removed(self, hashes: object, medium: object, group: object, typed: bool) -> BlocksRemoved:
        key = table_key(
            rules.short_str(medium, "medium", rules.MAX_MEDIUM_BYTES), rules.group_of(group)
        )
        return BlocksRemoved(rules.hashes_of(hashes, typed)[0], key)

    # --- typed decodes ------------------------------------------------------------------------
    def from_typed(self, wire_events: list[Any]) -> list[KVEvent]:
        events: list[KVEvent] = []
        for event in wire_events:
            kind = type(event)
            if kind is MapBlockStored or kind is ArrayBlockStored:
                events.append(
                    self.stored(
                        event.block_hashes,
                        event.parent_block_hash,
                        event.token_ids,
                        event.block_size,
                        event.lora_id,
                        event.medium,
                        event.lora_name,
                        event.extra_keys,
                        event.group_idx,
                        typed=True,
                        cache_salt=getattr(event, "cache_salt", None),
                    )
                )
            elif kind is MapBlockRemoved or kind is ArrayBlockRemoved:
                _add_removal(
                    events, self.removed(event.block_hashes, event.medium, event.group_idx, True)
                )
            else:
                events.append(AllCleared())
        return events

    # --- generic decodes ----------------------------------------------------------------------
    def from_generic(self, raw: object) -> KVEvent:
        """One event of any layout; MalformedPayload UNKNOWN_EVENT_TYPE for a type it does not
        know (the caller skips it), BAD_EVENT for a known one that breaks a rule."""
        tag, f = _fields_of(raw)
        if tag == "AllBlocksCleared":
            return AllCleared()
        if "block_hashes" not in f:
            rules.bad(f"{tag} without block_hashes")
        if tag == "BlockRemoved":
            return self.removed(f["block_hashes"], f.get("medium"), f.get("group_idx"), False)
        return self.stored(
            f["block_hashes"],
            f.get("parent_block_hash"),
            f.get("token_ids", []),
            f.get("block_size", 0),
            f.get("lora_id"),
            f.get("medium"),
            f.get("lora_name"),
            f.get("extra_keys"),
            f.get("group_idx"),
            typed=False,
            cache_salt=f.get("cache_salt"),
        )


def _add_removal(events: list[KVEvent], removal: BlocksRemoved) -> None:
    """Append `removal`, joined to the event before when that is a removal from the same table.

    vLLM sends one `BlockRemoved` per evicted hash; applying them as one list is the same change
    (removals commute with each other) at a fraction of the per-event cost.
    """
    last = events[-1] if events else None
    if type(last) is BlocksRemoved and last.table == removal.table:
        last.hashes.extend(removal.hashes)  # the lists are fresh from the decoder
    else:
        events.append(removal)


# Positional field names of the array layout, in order after the tag.
ARRAY_FIELDS = {
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


def _fields_of(raw: object) -> tuple[str, dict[Any, Any]]:
    """The tag and fields of one generically decoded event, map or array layout."""
    if type(raw) is dict:
        tag = raw.get("type")
        fields = raw
    elif type(raw) is list and raw:
        tag = raw[0]
        fields = {}
    else:
        rules.bad(f"an event is a {type(raw).__name__}")
    if type(tag) is not str:
        rules.bad(f"an event's type is a {type(tag).__name__}")
    names = ARRAY_FIELDS.get(tag)
    if names is None:
        raise MalformedPayload(MalformedKind.UNKNOWN_EVENT_TYPE, f"event type {tag!r:.40}")
    if type(raw) is list:
        fields = dict(zip(names, raw[1:], strict=False))
    return tag, fields


class BatchDecoder:
    """Decodes payloads of one stream; remembers which layout the stream speaks.

    A batch that breaks a rule raises `MalformedPayload`, and nothing of it is returned. `errors`
    receives one `MalformedPayload` (UNKNOWN_EVENT_TYPE) per event of a type it does not know,
    skipped; the rest of the batch is returned.
    """

    def __init__(self, limits: IngestLimits = DEFAULT_LIMITS) -> None:
        self._order = list(_TYPED_DECODERS)
        self.layouts: Final = self._order
        """The layouts in the order tried (the same list): the map layout's (`MAP_LAYOUT`)
        first while the stream speaks it. Read for every batch applied from its bytes."""
        self._convert = _Converter(limits)
        self.max_block_size: Final = limits.max_block_size
        """Read for every live batch: an attribute, not a property (a call each time)."""

    def decode(
        self,
        payload: bytes,
        seq: int,
        errors: list[MalformedPayload] | None = None,
        decoded: Batch | None = None,
    ) -> Batch:
        """`decoded`: what `decode_map_batch` made of this payload and seq with the default
        limits, if it took it (a fleet's router decodes each batch to read its rank); a decoder
        with other limits decodes the payload itself."""
        if decoded is not None and self.max_block_size == DEFAULT_LIMITS.max_block_size:
            batch: Batch | None = decoded
        else:
            batch = decode_map_batch(payload, seq, self.max_block_size)
        if batch is None:
            return self._decode_slow(payload, seq, errors)
        if self._order[0] is not _MAP_DECODER:  # (`took_map_layout`, without its call)
            self.took_map_layout()
        return batch

    def took_map_layout(self) -> None:
        """A batch the compiled decoder takes came (decoded here, or applied from its bytes by
        collector/_replay.pyx): the stream speaks the map layout (again)."""
        if self._order[0] is not _MAP_DECODER:
            self._order.remove(_MAP_DECODER)
            self._order.insert(0, _MAP_DECODER)

    def _decode_slow(
        self, payload: bytes, seq: int, errors: list[MalformedPayload] | None = None
    ) -> Batch:
        """Every layout and every error: what the compiled fast path declines."""
        for i, decoder in enumerate(self._order):
            try:
                wire = decoder.decode(payload)
            except (msgspec.DecodeError, RecursionError):  # not this layout (or nested too deep)
                continue
            if i:
                self._order.insert(0, self._order.pop(i))
            ts, rank = rules.ts_of(wire.ts), rules.rank_of(wire.data_parallel_rank)
            events = self._convert.from_typed(wire.events)
            return Batch(seq, ts, rank, events, payload_bytes=len(payload))
        return self._decode_generic(payload, seq, errors)

    def _decode_generic(
        self, payload: bytes, seq: int, errors: list[MalformedPayload] | None
    ) -> Batch:
        try:
            outer = _GENERIC_DECODER.decode(payload)
        except msgspec.DecodeError as exc:
            raise MalformedPayload(MalformedKind.UNDECODABLE, str(exc)) from exc
        except RecursionError as exc:
            raise MalformedPayload(MalformedKind.UNDECODABLE, "nested too deep") from exc
        if type(outer) is not list or len(outer) < 2 or type(outer[1]) is not list:
            raise MalformedPayload(MalformedKind.UNDECODABLE, "not a [ts, events, ...] batch")
        ts = rules.ts_of(outer[0])
        rank = rules.rank_of(outer[2] if len(outer) > 2 else None)
        events: list[KVEvent] = []
        dropped = 0
        for raw in outer[1]:
            try:
                event = self._convert.from_generic(raw)
            except MalformedPayload as exc:
                if exc.kind is not MalformedKind.UNKNOWN_EVENT_TYPE:
                    raise
                dropped += 1
                if errors is not None:
                    errors.append(exc)
                continue
            if type(event) is BlocksRemoved:
                _add_removal(events, event)
            else:
                events.append(event)
        return Batch(seq, ts, rank, events, dropped, len(payload))
