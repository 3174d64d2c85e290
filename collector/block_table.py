"""One (medium, group) table of a publisher's prefix cache, kept as vLLM's BlockPool keeps it.

Blocks are reference-counted by hash (vLLM stores and removes a hash once per physical copy).
Each block knows its parent hash; a block whose parent is not cached is an orphan and is kept
(gaps, late joins and keep-running resets make them). Children are linked to their parent so
that `hittable` (every ancestor cached) is maintained incrementally: storing or removing a block
touches only the subtree whose hittability changes.

Per-block columns live in `array`s indexed by a slot number, not in per-block objects: a
million cached blocks cost a slot-map entry (collector/_table_core.pyx) plus a few dozen bytes
of columns each.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from kvscope.collector import _lookup, _table_counts
from kvscope.collector._slot_map import SlotMap
from kvscope.collector._table_core import (
    ASIDE,
    FOREIGN_EXTRA,
    HAS_PARENT,
    HAS_TOKENS,
    HITTABLE,
    NO_SLOT,
    TableCore,
)
from kvscope.collector.token_records import TokenRecords
from kvscope.collector.types import TableKey


def extras_bytes(extra: Any) -> int:
    """About what a block's extra keys hold: the length of each str and bytes in them, 8 for any
    other value (at most 8 for each byte they took on the wire). Counted with the tokens against
    the stream's limit; a LoRA name is not (at most 256 bytes, one str for an event's blocks)."""
    if isinstance(extra, list | tuple):
        size = 0
        for item in extra:
            if isinstance(item, str | bytes):
                size += len(item)
            else:
                size += extras_bytes(item) if isinstance(item, list | tuple) else 8
        return size
    return 0 if extra is None else 8


def _column(typecode: str, data: Any) -> array[Any]:
    """A checkpoint's array: bytes, or an array the snapshot decoder made (taken as it is, not
    copied again)."""
    if isinstance(data, array) and data.typecode == typecode:
        return data
    column = array(typecode)
    column.frombytes(data)
    return column


_ENTRY_BYTES = array("Q").itemsize + array("i").itemsize
"""A slot map entry as `to_state` gives it: a hash and its slot."""


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """One cached hash of a table, as a dump or an API shows it."""

    hash: int
    count: int
    parent: int | None
    hittable: bool
    token_ids: tuple[int, ...] | None
    first_stored: float
    last_stored: float
    lora_name: str | None
    extra_keys: Any
    raw_hash: bytes | None


@dataclass(frozen=True, slots=True)
class Subtree:
    head: int
    orphan: bool
    """The head's parent is named but not cached (a keep-running reset, a gap, a late join)."""
    blocks: int
    leaf_depths: list[int]
    deepest_leaf: int


class TableStats(msgspec.Struct, frozen=True, gc=False):  # untracked: one per batch in a recovery
    blocks: int
    """Distinct cached hashes."""
    copies: int
    """Physical blocks holding them (sum of reference counts)."""
    hittable: int
    orphans: int
    """Blocks whose parent is not cached (the heads of unreachable chains)."""


class BlockTable(TableCore):
    """The cached blocks of one (medium, group) of one publisher.

    `TableCore(key, base_ts)` (collector/_table_core.pyx) holds the state as C fields and does
    the ingest hot path: `store_chain(hashes, parent, token_ids, block_size, ts, lora_name=None,
    extra_keys=None, raw_hashes=None, raw_parent=None)` applies one `BlockStored` (block i's
    parent is block i-1, block 0's is `parent`); `remove(hashes)` one `BlockRemoved` (one copy
    of each hash is gone). The common cases run in C; the rare ones call back into the methods
    below.
    """

    # --- checkpoints --------------------------------------------------------------------------
    _COLUMNS = (
        "_count",
        "_parent",
        "_first_child",
        "_next_sibling",
        "_prev_sibling",
        "_flags",
        "_first_ms",
        "_last_ms",
        "_tokens",
    )

    def to_state(self, interned_tokens: bool = False) -> dict[str, Any]:
        """Everything this table holds, as plain values, for checkpoints: columns as memoryviews
        of the live arrays, to be encoded (copied once) before the table changes again.
        `interned_tokens`: the tokens column, where it is whole blocks of the table's size, as
        `TokenRecords` (what formats 3 and 5 keep), interned from the packed column."""
        hashes, slots = self._slot_of.to_arrays()
        columns = [memoryview(getattr(self, name)) for name in self._COLUMNS[:-1]]  # (tokens last)
        tokens = self._token_column
        if interned_tokens and tokens.block_size == self.block_size > 0:
            columns.append(TokenRecords(*tokens.interned()))  # type: ignore[arg-type]
        else:
            columns.append(memoryview(self._tokens))
        return {
            "medium": self.key.medium,
            "group": self.key.group,
            "base_ts": self.base_ts,
            "block_size": self.block_size,
            "counts": [self.hittable_count, self.orphan_count, self.copies, self.unknown_removals],
            "saturated_stores": self.saturated_stores,
            "hashes": memoryview(hashes),
            "slots": memoryview(slots),
            "columns": columns,
            "free": memoryview(array("i", self._free)),
            "high": self._high,
            "waiting": list(self._waiting.items()),
            "roots": [(key, list(slots)) for key, slots in self._roots.items()],
            "odd_tokens": list(self._odd_tokens.items()),
            "extras": [(slot, lora, extra) for slot, (lora, extra) in self._extras.items()],
            "raw": list(self._raw.items()),
            "raw_parent": list(self._raw_parent.items()),
        }

    def state_bytes(self) -> int:
        """About the bytes of `to_state`'s arrays: the slot map's hashes and slots, a slot of
        each column but the tokens, and the tokens (at 4 bytes a token) and what is held aside."""
        return (
            _ENTRY_BYTES * len(self._slot_of) + _SLOT_BYTES * len(self._count) + self.token_bytes()
        )

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BlockTable:
        table = cls(TableKey(state["medium"], state["group"]), state["base_ts"])
        table.block_size = state["block_size"]
        table.hittable_count, table.orphan_count, table.copies, table.unknown_removals = state[
            "counts"
        ]
        table.saturated_stores = state.get("saturated_stores", 0)
        hashes, slots = _column("Q", state["hashes"]), _column("i", state["slots"])
        table._slot_of = SlotMap.from_arrays(hashes, slots)
        columns = dict(zip(cls._COLUMNS, state["columns"], strict=True))
        n_slots = len(columns["_parent"]) // 8
        if n_slots and len(columns["_count"]) == 2 * n_slots:
            # Written when copy counts were uint16.
            columns["_count"] = array("I", array("H", bytes(columns["_count"]))).tobytes()
        for name, data in columns.items():
            setattr(table, name, _column(getattr(table, name).typecode, data))
        table._free = _column("i", state["free"]).tolist()
        # Without "high" (written before slots were handed out from a high-water mark), the
        # free list holds every slot never used as well: none is left above the columns' end.
        table._high = state.get("high", len(table._count))
        table._waiting = {parent: list(slots) for parent, slots in state["waiting"]}
        table._roots = {bytes(key): dict.fromkeys(slots) for key, slots in state["roots"]}
        table._odd_tokens = {
            # uint32 bytes, or a list of ints when written before
            slot: bytes(tokens) if isinstance(tokens, bytes) else array("I", tokens).tobytes()
            for slot, tokens in state["odd_tokens"]
        }
        table._extras = {slot: (lora, extra) for slot, lora, extra in state["extras"]}
        table.side_bytes = sum(len(tokens) for tokens in table._odd_tokens.values()) + sum(
            extras_bytes(extra) for _, extra in table._extras.values()
        )
        table._raw = {h: bytes(raw) for h, raw in state["raw"]}
        table._raw_parent = {slot: bytes(raw) for slot, raw in state["raw_parent"]}
        flags = table._flags
        for aside in (table._odd_tokens, table._extras, table._raw_parent):
            for slot in aside:
                flags[slot] |= ASIDE  # (a checkpoint written before the flag lacks it)
        return table

    # --- reads --------------------------------------------------------------------------------
    def stats(self) -> TableStats:
        return TableStats(len(self._slot_of), self.copies, self.hittable_count, self.orphan_count)

    def count(self, block_hash: int) -> int:
        slot = self._slot_of.get(block_hash)
        return 0 if slot is None else self._count[slot]

    def is_hittable(self, block_hash: int) -> bool:
        slot = self._slot_of.get(block_hash)
        return slot is not None and bool(self._flags[slot] & HITTABLE)

    def parent_of(self, block_hash: int) -> int | None:
        slot = self._slot_of[block_hash]
        return self._parent[slot] if self._flags[slot] & HAS_PARENT else None

    def hashes(self) -> frozenset[int]:
        """The cached hashes (`counts()`'s keys, without building the counts)."""
        return frozenset(self._slot_of)

    def hash_array(self) -> array[int]:
        """The cached hashes as a new `array("Q")`, in no set order: a copy made in C."""
        return self._slot_of.to_arrays()[0]

    # The hittable hashes as a new `array("Q")`, in `hash_array()`'s order, read from the
    # flags in one pass (compiled, collector/_table_counts.pyx).
    hittable_hash_array = _table_counts.hittable_hash_array

    def counts(self) -> dict[int, int]:
        """hash -> reference count: the shape of vLLM's `cached_block_hash_to_block`."""
        count = self._count
        return {h: count[s] for h, s in self._slot_of.items()}

    def entries(self) -> Iterator[BlockEntry]:
        for block_hash, slot in self._slot_of.items():
            yield self._entry(block_hash, slot)

    def entry(self, block_hash: int) -> BlockEntry:
        """One cached block (KeyError if it is not cached)."""
        return self._entry(block_hash, self._slot_of[block_hash])

    def _entry(self, block_hash: int, slot: int) -> BlockEntry:
        flags = self._flags[slot]
        lora, extra = self._extras.get(slot, (None, None))
        return BlockEntry(
            hash=block_hash,
            count=self._count[slot],
            parent=self._parent[slot] if flags & HAS_PARENT else None,
            hittable=bool(flags & HITTABLE),
            token_ids=self._tokens_of(slot),
            first_stored=self.base_ts + self._first_ms[slot] / 1000,
            last_stored=self.base_ts + self._last_ms[slot] / 1000,
            lora_name=lora,
            extra_keys=extra,
            raw_hash=self._raw.get(block_hash),
        )

    def raw_hash(self, block_hash: int) -> bytes | None:
        return self._raw.get(block_hash)

    def raw_parent(self, block_hash: int) -> bytes | None:
        """The bytes form of a block's parent hash, when the publisher sends bytes hashes."""
        parent = self.parent_of(block_hash)
        if parent is None:
            return None
        return self._raw.get(parent) or self._raw_parent.get(self._slot_of[block_hash])

    def _tokens_of(self, slot: int) -> tuple[int, ...] | None:
        odd = self._odd_tokens.get(slot)
        if odd is not None:
            return tuple(array("I", odd))
        if not self._flags[slot] & HAS_TOKENS:
            return None
        return self._token_column.block(slot)

    # --- lookup by tokens ---------------------------------------------------------------------
    # How many leading full blocks of a `TokenQuery` are cached here, chained from block 0:
    # block contents are matched along the chain (vLLM's hash is not recomputed), the first block
    # among the roots, each next one among the children of the one before. Compiled
    # (collector/_lookup.pyx): the API runs it on every table of every replica per request.
    longest_prefix = _lookup.longest_prefix

    # How many of some hashes (an `array("Q")`) are cached here (`hittable=True`: and
    # hittable): a recovery point reads a whole before map so, a probe each (compiled,
    # collector/_table_counts.pyx).
    count_cached = _table_counts.count_cached

    def subtrees(self) -> Iterator[Subtree]:
        """Each tree of cached blocks, from a head whose parent is not cached (a root, or an
        orphan): its size and the depth of each of its leaves (a leaf's prefix, in blocks)."""
        flags, parents, slot_of = self._flags, self._parent, self._slot_of
        first_child, next_sibling = self._first_child, self._next_sibling
        hash_of = {slot: h for h, slot in slot_of.items()}
        for head_hash, head in slot_of.items():
            has_parent = flags[head] & HAS_PARENT
            if has_parent and parents[head] in slot_of:
                continue
            blocks, leaves, deepest = 0, [], (0, head_hash)
            stack = [(head, 1)]
            while stack:
                slot, depth = stack.pop()
                blocks += 1
                child = first_child[slot]
                if child == NO_SLOT:
                    leaves.append(depth)
                    deepest = max(deepest, (depth, hash_of[slot]))
                while child != NO_SLOT:
                    stack.append((child, depth + 1))
                    child = next_sibling[child]
            yield Subtree(head_hash, bool(has_parent), blocks, leaves, deepest[1])

    # --- the rare cases the compiled writes call back (hooks declared in _table_core.pxd) ----
    def _set_extras(self, slot: int, lora_name: str | None, extra: Any) -> None:
        self._extras[slot] = (lora_name, extra)
        self.side_bytes += extras_bytes(extra)
        foreign = extra is not None and (
            not isinstance(extra, list | tuple) or len(extra) > (1 if lora_name else 0)
        )
        if foreign:
            self._flags[slot] |= FOREIGN_EXTRA

    def _adopt(self, block_hash: int, slot: int) -> None:
        """`block_hash` was the missing ancestor of earlier orphans: they rejoin the tree."""
        orphans = self._waiting.pop(block_hash)
        self.orphan_count -= len(orphans)
        for orphan in orphans:
            self._link(slot, orphan)
            if self._flags[slot] & HITTABLE:
                self._mark_subtree(orphan, True)

    def _drop_block(self, block_hash: int, slot: int, parent_slot: int) -> None:
        flags = self._flags[slot]
        parent = self._parent[slot]
        del self._slot_of[block_hash]
        if flags & HAS_PARENT:
            if parent_slot == NO_SLOT:
                self._waiting[parent].remove(slot)
                if not self._waiting[parent]:
                    del self._waiting[parent]
                self.orphan_count -= 1
            else:
                self._unlink(parent_slot, slot)
        elif flags & HAS_TOKENS or slot in self._odd_tokens:
            self._forget_root(slot)
        if flags & HITTABLE:
            self.hittable_count -= 1
        # Its children now name a missing parent.
        child = self._first_child[slot]
        if child != NO_SLOT:
            waiting = self._waiting.setdefault(block_hash, [])
            while child != NO_SLOT:
                following = self._next_sibling[child]
                self._next_sibling[child] = self._prev_sibling[child] = NO_SLOT
                waiting.append(child)
                self.orphan_count += 1
                if flags & HITTABLE:
                    self._mark_subtree(child, False)
                child = following
        self._flags[slot] = 0
        odd = self._odd_tokens.pop(slot, None)
        if odd is not None:
            self.side_bytes -= len(odd)
        extras = self._extras.pop(slot, None)
        if extras is not None:
            self.side_bytes -= extras_bytes(extras[1])
        if self._raw:
            self._raw.pop(block_hash, None)
            self._raw_parent.pop(slot, None)
        self._release(slot)

    def _mark_subtree(self, top: int, hittable: bool) -> None:
        """Set `hittable` on `top` and every descendant whose flag differs (they all do)."""
        flags, first_child, next_sibling = self._flags, self._first_child, self._next_sibling
        stack = [top]
        changed = 0
        while stack:
            slot = stack.pop()
            if bool(flags[slot] & HITTABLE) == hittable:
                continue  # guards against hash cycles in hostile input
            flags[slot] ^= HITTABLE
            changed += 1
            child = first_child[slot]
            while child != NO_SLOT:
                stack.append(child)
                child = next_sibling[child]
        self.hittable_count += changed if hittable else -changed


_SLOT_BYTES: int = sum(
    getattr(BlockTable(TableKey("GPU", 0), 0.0), name).itemsize
    for name in BlockTable._COLUMNS
    if name != "_tokens"
)
"""A slot of every column but the tokens."""
