"""benchmarks/_content_floor.py: what a stream's content weighs before any store packs it."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _content_floor import content_floor


def _stored(hashes: list[int], tokens: list[int], parent: int | None = None) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": 4,
    }


def _batch(*events: dict[str, object]) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


def test_the_floor_counts_each_distinct_block_and_hash_once() -> None:
    # Two distinct 4-token blocks over 4 equally frequent tokens: 2 bits a token, 8 tokens;
    # the second batch stores the first block again under its old hash and removes it.
    payloads = [
        _batch(_stored([10, 11], [0, 1, 2, 3, 3, 2, 1, 0])),
        _batch(
            _stored([10], [0, 1, 2, 3]),
            {"type": "BlockRemoved", "block_hashes": [10, 11]},
            {"type": "AllBlocksCleared"},
        ),
    ]
    floor = content_floor(payloads)
    assert floor.block_events == 5
    assert floor.token_bytes == pytest.approx(8 * 2 / 8)
    assert floor.hash_bytes == 2 * 8
    assert floor.total == pytest.approx(18.0)


def test_array_like_events_count_as_tagged_ones() -> None:
    # vLLM before 0.10 sent each event as an array: [tag, hashes, parent, tokens, block size...].
    tagged = _batch(_stored([7], [5, 5, 6, 6]))
    arrays = msgspec.msgpack.encode([1.0, [["BlockStored", [7], None, [5, 5, 6, 6], 4]], 0])
    assert content_floor([arrays]) == content_floor([tagged])
