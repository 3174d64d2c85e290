"""What SGLang's per-page fields mean in the map: `cache_salt`, `lora_name`, `session_id`.

SGLang namespaces a page's hash by the request's `cache_salt`: a salted page serves only
requests with that salt. It is kept as the block's extra key (as vLLM keeps a salt), so the dump
shows it and `POST /lookup`, which cannot name a salt, never counts a salted page as a hit.
`lora_name` is kept and matched by the lookup, as vLLM's. `session_id` says nothing about what
is cached (vLLM's own `session_id` is not kept either): a page is the same with or without it.
Batches are built with tests/sglang_events.py, after SGLang 0.5.23's source (its package does
not import here). Positive and negative hashes both: they take different decode paths.
"""

from __future__ import annotations

from typing import Any

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId, TableKey
from tests.sglang_events import sglang_batch, sglang_stored

PAGE = 16
TOKENS = list(range(7, 7 + PAGE))
GPU = TableKey("GPU", 0)


def followed(*events: dict[str, Any]) -> StreamIngest:
    ingest = StreamIngest(StreamId("s", 0), can_replay=False)
    for seq, event in enumerate(events):
        ingest.live_frames([b"", seq.to_bytes(8, "big"), sglang_batch(1.0, [event])], 1.0)
    assert ingest.counters.batches_applied == len(events) and not ingest.counters.malformed
    return ingest


def hits(ingest: StreamIngest, lora_name: str | None = None) -> int:
    return max(m.blocks for m in ingest.map.longest_prefix(TOKENS, lora_name))


def test_a_salted_page_is_kept_with_its_salt_and_never_a_lookups_hit() -> None:
    for page_hash in (5, -5):
        ingest = followed(sglang_stored(page_hash, None, TOKENS, cache_salt="tenant-a"))
        (entry,) = ingest.map.tables[GPU].entries()
        assert entry.extra_keys == ["tenant-a"]
        assert hits(ingest) == 0
        unsalted = followed(sglang_stored(page_hash, None, TOKENS))
        assert hits(unsalted) == 1


def test_lora_name_is_kept_and_matched() -> None:
    for page_hash in (9, -9):
        ingest = followed(sglang_stored(page_hash, None, TOKENS, lora_name="math"))
        (entry,) = ingest.map.tables[GPU].entries()
        assert entry.lora_name == "math"
        assert (hits(ingest, "math"), hits(ingest)) == (1, 0)


def test_session_id_changes_nothing() -> None:
    for page_hash in (3, -3):
        with_session = followed(sglang_stored(page_hash, None, TOKENS, session_id="chat-1"))
        without = followed(sglang_stored(page_hash, None, TOKENS))
        assert list(with_session.map.tables[GPU].entries()) == list(
            without.map.tables[GPU].entries()
        )
        assert hits(with_session) == 1
