"""SGLang's KV event batches as SGLang 0.5.23 publishes them, for tests.

SGLang's own package does not import here (it needs its GPU stack), so these copy its structures
as published in its source (python/sglang/srt/disaggregation/kv_events.py): an `EventBatch` is
`[ts, events, attn_dp_rank]`, each event a map tagged by `type`; `BlockStored` is one page
(signed int64 hash, its parent's, the page's tokens, `block_size` tokens in the page,
`lora_id` always None, `medium`, `cache_salt`, `session_id`, `lora_name`); `BlockRemoved` has
`block_hashes` and `medium`; `AllBlocksCleared` has no field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

Event = dict[str, Any]


def sglang_stored(
    page_hash: int,
    parent: int | None,
    tokens: Sequence[int],
    medium: str | None = "GPU",
    cache_salt: str | None = None,
    session_id: str | None = None,
    lora_name: str | None = None,
) -> Event:
    return {
        "type": "BlockStored",
        "block_hashes": [page_hash],
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": len(tokens),
        "lora_id": None,
        "medium": medium,
        "cache_salt": cache_salt,
        "session_id": session_id,
        "lora_name": lora_name,
    }


def sglang_removed(hashes: Sequence[int], medium: str | None = "GPU") -> Event:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def sglang_cleared() -> Event:
    return {"type": "AllBlocksCleared"}


def sglang_batch(ts: float, events: Sequence[Event], attn_dp_rank: int = 0) -> bytes:
    return msgspec.msgpack.encode([ts, list(events), attn_dp_rank])
