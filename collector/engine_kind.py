"""Which engine publishes a stream: configured per replica, or told by its batches' fields.

SGLang's `BlockStored` carries `cache_salt`, which vLLM's never has, and `session_id`, which
vLLM's may carry too (since 0.30) but then beside `group_idx`, which vLLM sends with every
`BlockStored` (since 0.20) and SGLang never. The keys are looked for in the payload's bytes (as
msgpack fixstr keys), only until the engine is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kvscope.collector.types import BlocksStored, KVEvent

Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")
_CACHE_SALT, _SESSION_ID, _GROUP_IDX = b"\xaacache_salt", b"\xaasession_id", b"\xa9group_idx"


def engine_of(payload: bytes, events: Sequence[KVEvent]) -> Engine | None:
    """The engine a batch tells of; None when it has no `BlockStored` to tell by."""
    if not any(type(e) is BlocksStored for e in events):
        return None
    if _CACHE_SALT in payload or (_SESSION_ID in payload and _GROUP_IDX not in payload):
        return "sglang"
    return "vllm"
