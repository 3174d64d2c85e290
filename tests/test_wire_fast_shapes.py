"""The compiled decoder on hand-picked shapes: field order, widths, unknown keys, fallbacks."""

from __future__ import annotations

import random
import struct
from array import array
from typing import Any

import msgspec
import pytest

from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.types import BlocksRemoved, BlocksStored
from kvscope.collector.wire import _TYPED_DECODERS, BatchDecoder
from tests.wire_fast_support import MAX_BS, check, pack

# --- hand-picked shapes -------------------------------------------------------------------------
STORED = {"type": "BlockStored", "block_hashes": [1, 2], "token_ids": [5] * 32, "block_size": 16}
E = msgspec.msgpack.encode


def test_defaults_and_fields_in_any_order() -> None:
    fast = check(E([1.5, [{"block_hashes": [7], "type": "BlockStored"}]]))
    assert fast is not None and fast.rank is None
    stored = fast.events[0]
    assert type(stored) is BlocksStored and list(stored.token_ids) == [] and stored.block_size == 0


def test_top_level_fields_of_a_later_vllm_are_skipped() -> None:
    fast = check(E([1.0, [STORED], 4, {"future": [1, "x"]}, None]))
    assert fast is not None and fast.rank == 4


def test_float32_ts_and_wide_ints() -> None:
    ts = b"\xca" + struct.pack(">f", 2.5)
    hashes = b"\x92\xd0\x05\xcf" + struct.pack(">Q", 2**64 - 1)  # int8 5, uint64 max
    tokens = b"\x92\xce" + struct.pack(">I", 2**32 - 1) + b"\x07"
    event = (
        b"\x84\xa4type\xabBlockStored\xacblock_hashes"
        + hashes
        + b"\xa9token_ids"
        + tokens
        + b"\xaablock_size\xcd\x00\x01"  # uint16 1
    )
    fast = check(b"\x93" + ts + b"\x91" + event + b"\xd1\x00\x02")  # rank as int16
    assert fast is not None and fast.ts == 2.5 and fast.rank == 2
    stored = fast.events[0]
    assert type(stored) is BlocksStored and stored.hashes == [5, 2**64 - 1]
    assert list(stored.token_ids) == [2**32 - 1, 7] and stored.block_size == 1


def test_long_token_and_hash_arrays_are_read_where_they_are() -> None:
    # Longer than the scan's buffers (2048 token ids, 256 hashes): read at use instead.
    tokens = [(k * 2654435761) % 2**32 for k in range(6000)]
    hashes = [(k * 0x9E3779B97F4A7C15) % 2**64 for k in range(300)]
    for block_size, n_hashes in ((8, 256), (8, 257), (20, 300)):
        n_tokens = block_size * n_hashes
        event = dict(
            STORED,
            block_hashes=hashes[:n_hashes],
            token_ids=tokens[:n_tokens],
            block_size=block_size,
        )
        removed = {"type": "BlockRemoved", "block_hashes": hashes[:n_hashes]}
        fast = check(E([1.0, [event, removed, removed], 0]))
        assert fast is not None
        stored, removal = fast.events  # the two removals from one table are one event
        assert isinstance(stored, BlocksStored) and list(stored.token_ids) == tokens[:n_tokens]
        assert isinstance(removal, BlocksRemoved) and removal.hashes == hashes[:n_hashes] * 2
    long = dict(STORED, block_hashes=hashes, token_ids=tokens[: 16 * 300])
    assert check(E([1.0, [long], 0])) is not None
    for bad in (2**32, -1, "x"):
        assert check(E([1.0, [dict(long, token_ids=[*tokens[: 16 * 300 - 1], bad])], 0])) is None
        assert check(E([1.0, [dict(STORED, token_ids=[*tokens[:31], bad])], 0])) is None
    for bad_hash in (-1, "x", None):
        assert check(E([1.0, [dict(long, block_hashes=[*hashes[:-1], bad_hash])], 0])) is None
        assert check(E([1.0, [dict(STORED, block_hashes=[1, bad_hash])], 0])) is None


def test_token_ids_and_hashes_only_matter_where_the_event_has_them() -> None:
    # The scan reads them before the tag may say whether they count: it must still step over
    # whatever they are, and decline only for an event that takes them.
    for value in ([2**32, -1, "x", [1]], [5] * 3000, "x", None, {"a": [1.5]}):
        cleared = {"token_ids": value, "type": "AllBlocksCleared", "block_hashes": value}
        assert check(E([1.0, [cleared], 0])) is not None
        removed = {"token_ids": value, "type": "BlockRemoved", "block_hashes": [9]}
        assert check(E([1.0, [removed], 0])) is not None
    deep: Any = None
    for _ in range(100):
        deep = [deep]
    assert check(E([1.0, [{"type": "AllBlocksCleared", "token_ids": [deep]}], 0])) is None


def test_removals_of_one_table_merge_like_today() -> None:
    def removed(h: int, medium: str | None, group: int | None) -> dict[str, Any]:
        return {"type": "BlockRemoved", "block_hashes": [h], "medium": medium, "group_idx": group}

    events = [
        removed(1, "GPU", 0),
        removed(2, None, None),  # the same table as GPU/0
        removed(3, "CPU", 0),
        STORED,
        removed(4, "CPU", 0),
        {"type": "AllBlocksCleared"},
        removed(5, "CPU", 0),
        removed(6, "CPU", 0),
    ]
    fast = check(E([1.0, events, 0]))
    assert fast is not None
    assert [getattr(e, "hashes", None) for e in fast.events] == [
        [1, 2],
        [3],
        [1, 2],
        [4],
        None,
        [5, 6],
    ]


@pytest.mark.parametrize(
    "payload",
    [
        E([1.0, [["BlockStored", [1], None, [], 16, None]], 0]),  # vLLM <= 0.23 arrays
        E([1.0, [dict(STORED, type="Other")], 0]),
        E([1.0, [{"block_hashes": [1]}], 0]),
        E([1.0, [{"type": "BlockRemoved"}], 0]),
        E([1.0, [dict(STORED, block_hashes=[b"\x01" * 8])], 0]),
        E([1.0, [dict(STORED, block_hashes=[-1])], 0]),
        E([1.0, [dict(STORED, parent_block_hash="x")], 0]),
        E([1.0, [dict(STORED, token_ids=[2**32])], 0]),
        E([1.0, [dict(STORED, token_ids=[-1])], 0]),
        E([1.0, [dict(STORED, block_size=None)], 0]),
        E([1.0, [dict(STORED, medium=1)], 0]),
        E([1.0, [dict(STORED, group_idx=1.0)], 0]),
        E([1.0, [dict(STORED, extra_keys=[["salt"], None])], 0]),
        E([1.0, [dict(STORED, lora_id="x")], 0]),
        E([1, [STORED], 0]),  # an int ts: msgspec takes it, we leave it to msgspec
        E([1.0, [STORED], True]),
        E([1.0]),
        E({"ts": 1.0}),
        E([1.0, [STORED], 0]) + b"\x00",  # trailing bytes
        E([1.0, [STORED], 0])[:-1],
        b"",
        b"\xc1",
    ],
)
def test_anything_else_falls_back(payload: bytes) -> None:
    assert check(payload) is None


def test_duplicate_keys_fall_back() -> None:
    hashes = b"\xacblock_hashes\x91\x01"
    event = b"\x83\xa4type\xabBlockStored" + hashes + hashes
    assert check(b"\x93\xcb" + struct.pack(">d", 1.0) + b"\x91" + event + b"\x00") is None


def test_nesting_is_bounded() -> None:
    deep: Any = None
    for _ in range(100):
        deep = [deep]
    payload = E([1.0, [dict(STORED, deep=deep)], 0])
    assert check(payload) is None
    shallow = E([1.0, [dict(STORED, deep=[[[[None]]]])], 0])
    assert check(shallow) is not None


def test_only_bytes_are_read() -> None:
    payload = E([1.0, [STORED], 0])
    assert decode_map_batch(bytearray(payload), 0, MAX_BS) is None  # type: ignore[arg-type]
    assert decode_map_batch(memoryview(payload), 0, MAX_BS) is None  # type: ignore[arg-type]


def test_batch_decoder_takes_the_fast_path_and_keeps_the_layout() -> None:
    decoder = BatchDecoder()
    old = decoder.decode(E([1.0, [["BlockStored", [1], None, [5] * 16, 16, None]], 0]), 0)
    assert list(old.events[0].token_ids) == [5] * 16  # type: ignore[union-attr]
    assert decoder._order[0] is _TYPED_DECODERS[1]  # the array layout is tried first now
    batch = decoder.decode(E([1.0, [STORED], 0]), 1)
    assert type(batch.events[0].token_ids) is array  # type: ignore[union-attr]
    assert decoder._order[0] is _TYPED_DECODERS[0]  # the map layout is tried first again


def test_token_ids_of_any_width_up_to_the_payloads_end() -> None:
    # The token array last in the payload: the scan's runs of items meet the end of the bytes.
    rnd = random.Random(5)
    for n_tokens in range(0, 13):
        for _ in range(20):
            tokens = [rnd.choice((0, 5, 200, 70_000, 2**32 - 1)) for _ in range(n_tokens)]
            head = {"type": "BlockStored", "block_hashes": [1], "block_size": n_tokens}
            body = b"".join(pack(k, rnd) + pack(v, rnd) for k, v in head.items())
            event = bytes([0x80 | 4]) + body + pack("token_ids", rnd) + pack(tokens, rnd)
            payload = b"\x92" + pack(1.5, rnd) + b"\x91" + event
            fast = check(payload)
            assert fast is not None
            stored = fast.events[0]
            assert type(stored) is BlocksStored and list(stored.token_ids) == tokens
            for cut in range(len(payload)):
                assert check(payload[:cut]) is None


@pytest.mark.parametrize(
    "extra_keys", [[], [None], [None, None], [0, -3, None], [True], ["a"], [[None]], [1.5]]
)
def test_short_extra_keys_are_stepped_over_as_before(extra_keys: list[Any]) -> None:
    rnd = random.Random(6)
    for bs in (0, 1):
        event = dict(STORED, block_hashes=[1] * len(extra_keys), block_size=bs, token_ids=[])
        for last in (False, True):
            fields = (
                dict(event, extra_keys=extra_keys) if last else {"extra_keys": extra_keys, **event}
            )
            payload = b"\x92" + pack(1.0, rnd) + b"\x91" + pack(fields, rnd)
            check(payload)
            for cut in range(len(payload)):
                assert check(payload[:cut]) is None
