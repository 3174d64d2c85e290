"""What a decoded batch must be, whichever layout and decoder it came through: each field's rule.

`wire.py` builds every domain event through these functions; the compiled decoder
(`_wire_fast.pyx`) checks the same rules in C with the constants below, and declines what they
would refuse (the slow path then refuses it). A known event that breaks a rule refuses its whole
batch: `MalformedPayload` (BAD_EVENT, or LIMIT_EXCEEDED for `max_block_size`; BAD_BATCH for the
batch's own ts and rank), and nothing of the batch is applied.

The ranges are what vLLM 0.9 to 0.33 and its KV connectors send (vllm/distributed/kv_events.py,
v1/core/block_pool.py, the offloading, LMCache, Mooncake and simple-offload connectors):
- ts: a float within +-MAX_ABS_TS (msgpack int accepted, as msgspec accepts one for a float
  field): vLLM sends `time.time()`, and the store keeps `int(ts)` and milliseconds in 64-bit ints.
- data_parallel_rank: None or 0..MAX_RANK.
- a block hash: an int in [-2**63, 2**64) (negative: Python's `hash()` of vLLM < 0.10.2), or
  1..MAX_HASH_BYTES bytes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); parent_block_hash too, or None.
- token_ids: ints in [0, 2**32), and as many as the blocks hold: `block_size` per hash, or none
  (CPU-offload placeholders send `token_ids=[]` with `block_size` 0, Mooncake and the simple
  offload connector `[]` with the real size), or whole blocks more than the hashes (the block
  pool skips null and masked blocks of sliding-window and Mamba groups but sends the tokens of
  every block it walked).
- block_size: 0..max_block_size (`IngestLimits`).
- medium: None or a str of at most MAX_MEDIUM_BYTES (UTF-8); group_idx None or 0..MAX_GROUP.
- lora_name (and SGLang's cache_salt): None or a str of at most MAX_LORA_NAME_BYTES; lora_id:
  None or an int.
- extra_keys: None, or one entry per hash, each None or a list of at most MAX_EXTRA_ITEMS
  items: None, bool, int, float, str or bytes (at most MAX_EXTRA_BYTES), or a list of at most
  MAX_EXTRA_ITEMS such values (a multimodal `(identifier, offset)` pair). All None is None.
"""

from __future__ import annotations

from array import array
from typing import Any, NoReturn

from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.types import HASH_MASK

MAX_ABS_TS = 2.0**53
"""Seconds either side of the epoch a batch ts may lie (285 million years): exact as an int,
and its milliseconds fit 64 bits. Past it, `int(ts)` of the store's per-second rollups overflowed
SQLite's INTEGER and killed the store's writer (issue 12's fuzz run)."""
MIN_INT_HASH = -(1 << 63)
MAX_HASH_BYTES = 64
"""A sha256 block hash is 32 bytes."""
MAX_RANK = 65_535
MAX_GROUP = 65_535
MAX_MEDIUM_BYTES = 32
"""vLLM's tiers are GPU, CPU and STORAGE; connectors add a few (`cpu`, `CXL`, SGLang's
`CPU_PINNED`)."""
MAX_LORA_NAME_BYTES = 256
MAX_EXTRA_ITEMS = 4096
"""Items of one block's extra keys: a multimodal pair per item in the block, a LoRA name, a
salt, a digest."""
MAX_EXTRA_BYTES = 4096
"""A str or bytes in extra keys: a cache salt (a client's string), a multimodal identifier, a
prompt-embedding digest."""
TOKEN_ID_LIMIT = 1 << 32

_INT = frozenset({int})
_HASH_TYPES = frozenset({int, bytes})
_EXTRA_SCALARS = (type(None), bool, int, float, str, bytes)


def bad(what: str, kind: MalformedKind = MalformedKind.BAD_EVENT) -> NoReturn:
    raise MalformedPayload(kind, what)


def _shown(value: object) -> str:
    return (
        f"{value!r:.40}" if isinstance(value, str | bytes | int | float) else type(value).__name__
    )


# --- the batch ---------------------------------------------------------------------------------
def ts_of(value: object) -> float:
    if (type(value) is float or type(value) is int) and -MAX_ABS_TS <= value <= MAX_ABS_TS:
        return float(value)
    bad(f"batch ts {_shown(value)}", MalformedKind.BAD_BATCH)


def rank_of(value: object) -> int | None:
    if value is None or (type(value) is int and 0 <= value <= MAX_RANK):
        return value
    bad(f"data_parallel_rank {_shown(value)}", MalformedKind.BAD_BATCH)


# --- block hashes ------------------------------------------------------------------------------
def hash_of(value: object, field: str = "block hash") -> int:
    """One hash in vLLM's unsigned int form, whatever form it travelled in."""
    if type(value) is int and MIN_INT_HASH <= value <= HASH_MASK:
        return value & HASH_MASK
    if type(value) is bytes and 0 < len(value) <= MAX_HASH_BYTES:
        return int.from_bytes(value, "big") & HASH_MASK
    bad(f"{field} {_shown(value)}")


def hashes_of(values: object, typed: bool) -> tuple[list[int], list[bytes] | None, bool]:
    """The hashes in int form, the raw bytes when they all travelled as bytes, and whether any
    was a negative int. `typed`: msgspec already made every item an int or bytes."""
    if type(values) is not list:
        bad(f"block_hashes is a {type(values).__name__}")
    if not values:
        return values, None, False
    if not typed:
        types = frozenset(map(type, values))
        if not types <= _HASH_TYPES:
            bad(f"block_hashes holds a {next(iter(types - _HASH_TYPES)).__name__}")
    if typed or types == _INT:
        try:
            low, high = min(values), max(values)
            if low >= 0 and high <= HASH_MASK:
                return values, None, False  # the common case (vLLM >= 0.10.2), passed uncopied
            if low >= MIN_INT_HASH and high <= HASH_MASK:
                return [v & HASH_MASK for v in values], None, True
        except TypeError:  # bytes among them
            pass
    ints = [hash_of(v) for v in values]
    raw = [v for v in values if type(v) is bytes]
    signed = any(type(v) is int and v < 0 for v in values)
    return ints, (raw if len(raw) == len(values) else None), signed


def parent_of(value: object) -> int | None:
    return None if value is None else hash_of(value, "parent_block_hash")


# --- the other fields --------------------------------------------------------------------------
def block_size_of(value: object, max_block_size: int) -> int:
    if type(value) is not int or value < 0:
        bad(f"block_size {_shown(value)}")
    if value > max_block_size:
        bad(f"max_block_size={max_block_size}: block_size {value}", MalformedKind.LIMIT_EXCEEDED)
    return value


def token_ids_of(values: object, block_size: int, blocks: int, typed: bool) -> array[int]:
    """The token ids as an `array("I")` (what the block table keeps)."""
    if type(values) is not list:
        bad(f"token_ids is a {type(values).__name__}")
    if not typed and not frozenset(map(type, values)) <= _INT:
        bad("token_ids holds a non-int")
    try:
        tokens = array("I", values)
    except OverflowError:
        bad("a token id out of [0, 2**32)")
    n = len(tokens)
    if (
        n
        and n != block_size * blocks
        and not (block_size and n % block_size == 0 and n > block_size * blocks)
    ):
        bad(f"{n} token_ids for {blocks} blocks of {block_size}")
    return tokens


def short_str(value: object, field: str, limit: int) -> str | None:
    if value is None:
        return None
    if type(value) is str and len(value) <= limit and len(value.encode()) <= limit:
        return value
    bad(f"{field} {_shown(value)}")


def group_of(value: object) -> int | None:
    if value is None or (type(value) is int and 0 <= value <= MAX_GROUP):
        return value
    bad(f"group_idx {_shown(value)}")


def lora_id_ok(value: object) -> None:
    if value is not None and type(value) is not int:
        bad(f"lora_id {_shown(value)}")


def extra_keys_of(values: object, blocks: int) -> list[Any] | None:
    """One entry per block, or None when there are none (vLLM >= 0.17 sends a None per block)."""
    if values is None:
        return None
    if type(values) is not list or len(values) != blocks:
        bad(f"extra_keys: {_shown(values)} for {blocks} blocks")
    if values.count(None) == len(values):
        return None
    for entry in values:
        if entry is not None:
            _extra_entry(entry, 0)
    return values


def _extra_entry(entry: object, depth: int) -> None:
    if type(entry) is not list or len(entry) > MAX_EXTRA_ITEMS:
        bad(f"an extra_keys entry {_shown(entry)}")
    for item in entry:
        if type(item) is list and depth == 0:
            _extra_entry(item, 1)
        elif not isinstance(item, _EXTRA_SCALARS) or (
            isinstance(item, str | bytes) and len(item) > MAX_EXTRA_BYTES
        ):
            bad(f"an extra key {_shown(item)}")
