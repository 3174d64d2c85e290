"""What a stream's content weighs before any store packs it: the yardstick for disk per
block-event.

Counted once each: the tokens of every distinct block, at their order-0 entropy (each token
costs -log2 of its share among all the distinct blocks' tokens), and every distinct stored
hash at its full width (engine hashes are uniformly random). Removals, parents, timestamps
and repeats are left out: a store could in principle name them by reference. So this is
what a store that models tokens no better than one at a time cannot go below.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

HASH_BYTES_OF_INT = 8
"""An int hash on the wire is an int64 (vLLM's builtin and xxhash hashes, SGLang's)."""


@dataclass(frozen=True)
class ContentFloor:
    block_events: int
    token_bytes: float
    hash_bytes: int

    @property
    def total(self) -> float:
        return self.token_bytes + self.hash_bytes

    def per_event(self) -> float:
        return self.total / self.block_events if self.block_events else 0.0

    def line(self) -> str:
        n = self.block_events or 1
        return (
            f"  the content alone (each distinct block's tokens at order-0 entropy "
            f"{self.token_bytes / n:.1f}, each distinct stored hash {self.hash_bytes / n:.1f}): "
            f"{self.per_event():.1f} bytes per block-event"
        )


def content_floor(payloads: Iterable[bytes]) -> ContentFloor:
    """The floor of a stream's batches (msgpack `[ts, events, rank]`, events tagged or arrays)."""
    blocks: set[tuple[int, ...]] = set()
    hashes: dict[Any, int] = {}
    block_events = 0
    for payload in payloads:
        for event in msgspec.msgpack.decode(payload)[1]:
            kind, block_hashes, tokens, block_size = _fields(event)
            if kind == "BlockStored":
                block_events += len(block_hashes)
                for i, h in enumerate(block_hashes):
                    hashes.setdefault(h, HASH_BYTES_OF_INT if isinstance(h, int) else len(h))
                    blocks.add(tuple(tokens[i * block_size : (i + 1) * block_size]))
            elif kind == "BlockRemoved":
                block_events += len(block_hashes)
    counts = Counter(token for block in blocks for token in block)
    total = sum(counts.values())
    bits = -sum(c * math.log2(c / total) for c in counts.values())
    return ContentFloor(block_events, bits / 8, sum(hashes.values()))


def _fields(event: Any) -> tuple[str, list[Any], list[int], int]:
    """(kind, block hashes, token ids, block size) of a tagged event or an array-like one."""
    if isinstance(event, dict):
        return (
            event["type"],
            event.get("block_hashes") or [],
            event.get("token_ids") or [],
            event.get("block_size") or 1,
        )
    kind = event[0]
    if kind == "BlockStored":
        return kind, event[1], event[3], event[4]
    return kind, event[1] if len(event) > 1 else [], [], 1
