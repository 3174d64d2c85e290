"""SGLang's KV event batches, decoded as kvscope decodes vLLM's.

The encoder here is test-only: it copies the structures SGLang 0.5.23 publishes
(python/sglang/srt/disaggregation/kv_events.py: `EventBatch` is `[ts, events, attn_dp_rank]`,
events are maps tagged by `type`, one `BlockStored` per page with signed int64 hashes, no
`extra_keys` and no `group_idx`). SGLang's own package is not a test dependency yet.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kvscope.collector.errors import MalformedPayload
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import AllCleared, BlocksRemoved, BlocksStored, StreamId
from kvscope.collector.wire import BatchDecoder

PAGE = 16


def stored(h: int, parent: int | None, tokens: list[int], medium: str | None) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": [h],
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": PAGE,
        "lora_id": None,
        "medium": medium,
        "cache_salt": "tenant-a",
        "session_id": "s-1",
        "lora_name": None,
    }


def removed(h: int, medium: str | None) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": medium}


def decode(events: list[Any], rank: int | None = 0) -> tuple[list[Any], list[MalformedPayload]]:
    errors: list[MalformedPayload] = []
    payload = msgspec.msgpack.encode([1700000000.25, events, rank])
    batch = BatchDecoder().decode(payload, 3, errors)
    assert batch.rank == rank
    return batch.events, errors


def test_signed_page_hashes_and_extra_fields_decode() -> None:
    tokens = list(range(PAGE))
    events, errors = decode([stored(-2, None, tokens, None), stored(7, -2, tokens, "GPU")])
    assert errors == []
    assert all(type(e) is BlocksStored for e in events)
    hashes = [h for e in events for h in e.hashes]
    assert hashes == [(-2) & (2**64 - 1), 7]
    assert events[1].parent == (-2) & (2**64 - 1)
    assert {e.table.medium for e in events} == {"GPU"}


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        (None, "GPU"),
        ("GPU", "GPU"),
        ("CPU_PINNED", "CPU"),
        ("DISK", "DISK"),
        ("EXTERNAL", "EXTERNAL"),
    ],
)
def test_sglang_media_map_onto_tiers(medium: str | None, tier: str) -> None:
    events, _ = decode([stored(5, None, list(range(PAGE)), medium), removed(5, medium)])
    assert [e.table.medium for e in events] == [tier, tier]
    assert type(events[1]) is BlocksRemoved


def test_unknown_event_and_fields_are_skipped_not_fatal() -> None:
    unknown = {"type": "BlockPromoted", "block_hashes": [1]}
    extra = stored(9, None, list(range(PAGE)), "GPU") | {"future_field": [1, 2]}
    events, errors = decode([unknown, extra, {"type": "AllBlocksCleared"}])
    assert len(errors) == 1
    assert type(events[0]) is BlocksStored and events[0].hashes == [9]
    assert type(events[1]) is AllCleared


def test_an_sglang_stream_is_told_by_its_fields() -> None:
    ingest = StreamIngest(StreamId("s", 0), can_replay=False)
    ingest.live_frames([b"", (0).to_bytes(8, "big"), batch([removed(1, "GPU")])], 1.0)
    assert ingest.engine is None  # nothing stored yet: nothing to tell by
    tokens = list(range(PAGE))
    ingest.live_frames([b"", (1).to_bytes(8, "big"), batch([stored(-2, None, tokens, None)])], 2.0)
    assert ingest.engine == "sglang" and ingest.counters.batches_applied == 2


def batch(events: list[Any]) -> bytes:
    return msgspec.msgpack.encode([1700000000.25, events, 0])
