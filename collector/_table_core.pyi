from array import array
from collections.abc import Sequence
from typing import Any

from kvscope.collector._slot_map import SlotMap
from kvscope.collector._token_column import TokenColumn
from kvscope.collector.types import TableKey

HITTABLE: int
HAS_PARENT: int
HAS_TOKENS: int
FOREIGN_EXTRA: int
ASIDE: int
NO_SLOT: int
GROW_MIN: int
FIRST_SLOTS: int
TOKENS_STEP_MIN_BYTES: int

class TableCore:
    key: TableKey
    base_ts: float
    block_size: int
    hittable_count: int
    orphan_count: int
    copies: int
    unknown_removals: int
    saturated_stores: int
    side_bytes: int
    _slot_of: SlotMap
    _count: array[int]
    _parent: array[int]
    _first_child: array[int]
    _next_sibling: array[int]
    _prev_sibling: array[int]
    _flags: array[int]
    _first_ms: array[int]
    _last_ms: array[int]
    _tokens: array[int]
    _token_column: TokenColumn
    _free: list[int]
    _high: int
    _waiting: dict[int, list[int]]
    _roots: dict[bytes, dict[int, None]]
    _odd_tokens: dict[int, bytes]
    _extras: dict[int, tuple[str | None, Any]]
    _raw: dict[int, bytes]
    _raw_parent: dict[int, bytes]
    def __init__(self, key: TableKey, base_ts: float) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, block_hash: int) -> bool: ...
    def store_chain(
        self,
        hashes: list[int],
        parent: int | None,
        token_ids: Sequence[int],
        block_size: int,
        ts: float,
        lora_name: str | None = None,
        extra_keys: list[Any] | None = None,
        raw_hashes: list[bytes] | None = None,
        raw_parent: bytes | None = None,
    ) -> None: ...
    def remove(self, block_hashes: list[int]) -> None: ...
    def token_bytes(self) -> int: ...
    def _forget_root(self, slot: int) -> None: ...
    def _link(self, parent_slot: int, child: int) -> None: ...
    def _unlink(self, parent_slot: int, child: int) -> None: ...
    # Called back for the rare cases (declared in _table_core.pxd); BlockTable defines them.
    def _set_extras(self, slot: int, lora_name: str | None, extra: Any) -> None: ...
    def _adopt(self, block_hash: int, slot: int) -> None: ...
    def _drop_block(self, block_hash: int, slot: int, parent_slot: int) -> None: ...
    def _release(self, slot: int) -> None: ...
