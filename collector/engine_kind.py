"""Which engine publishes a stream: configured per replica, or told by its batches' fields.

SGLang's `BlockStored` carries `cache_salt` and `session_id`, which vLLM's never has; both
are map keys of ten characters (msgpack fixstr 0xaa), looked for only until the engine is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kvscope.collector.types import BlocksStored, KVEvent

Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")
_SGLANG_KEYS = (b"\xaasession_id", b"\xaacache_salt")


def engine_of(payload: bytes, events: Sequence[KVEvent]) -> Engine | None:
    """The engine a batch tells of; None when it has no `BlockStored` to tell by."""
    if not any(type(e) is BlocksStored for e in events):
        return None
    return "sglang" if any(key in payload for key in _SGLANG_KEYS) else "vllm"
