"""A fleet's messages for the tests: a batch as vLLM's publisher encodes it, behind its topic
and seq frames."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from vllm.distributed.kv_events import BlockStored, KVEventBatch


def payload(rank: int | None = 0, hashes: Sequence[int] = (1, 2)) -> bytes:
    """A batch of one BlockStored of `hashes` (two blocks of 16 tokens), DP rank `rank`."""
    event = BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=list(range(32)),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    return msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[event], data_parallel_rank=rank))


def message(
    topic: bytes, seq: int = 0, rank: int | None = 0, hashes: Sequence[int] = (1, 2)
) -> list[bytes]:
    """The frames a fleet's socket reads: the topic, the seq, `payload`'s batch."""
    return [topic, seq.to_bytes(8, "big"), payload(rank, hashes)]
