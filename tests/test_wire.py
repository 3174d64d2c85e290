"""Every vLLM wire layout from 0.9 to 0.33, written as it travels."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.types import AllCleared, BlocksRemoved, BlocksStored, TableKey
from kvscope.collector.wire import BatchDecoder

H1 = 0xF1E2D3C4B5A69788  # >= 2**63: sent as msgpack uint64
H2 = 0x0123456789ABCDEF
H3 = 0xDEADBEEFCAFEF00D
TOKENS = list(range(100, 132))  # two 16-token blocks


def encode(batch: Any) -> bytes:
    return msgspec.msgpack.encode(batch)


def decode(payload: bytes, seq: int = 7) -> tuple[list[Any], list[MalformedPayload]]:
    errors: list[MalformedPayload] = []
    batch = BatchDecoder().decode(payload, seq, errors)
    assert batch.seq == seq
    return batch.events, errors


# One fixture per layout: (vLLM version, payload as sent, expected rank)
LAYOUTS: list[tuple[str, list[Any], int | None]] = [
    (
        "0.9.0 arrays, signed hashes, no rank",
        [
            1700000000.5,  # ts
            [
                [
                    "BlockStored",  # tag
                    [-5, 6],  # block_hashes: Python hash(), may be negative
                    None,  # parent_block_hash
                    TOKENS,  # token_ids
                    16,  # block_size
                    None,  # lora_id
                ],
                ["BlockRemoved", [-5]],  # tag, block_hashes
                ["AllBlocksCleared"],
            ],
        ],
        None,
    ),
    (
        "0.9.1 arrays with data_parallel_rank",
        [1.0, [["BlockStored", [H1, H2], None, TOKENS, 16, None]], 1],
        1,
    ),
    (
        "0.10.2 arrays with medium",
        [1.0, [["BlockStored", [H1, H2], None, TOKENS, 16, None, "GPU"]], 0],
        0,
    ),
    (
        "0.14 arrays with lora_name",
        [1.0, [["BlockStored", [H1, H2], None, TOKENS, 16, None, "GPU", None]], 0],
        0,
    ),
    (
        "0.20 arrays with extra_keys and group_idx",
        [
            1.0,
            [
                [
                    "BlockStored",
                    [H1, H2],  # block_hashes
                    None,  # parent_block_hash
                    TOKENS,  # token_ids
                    16,  # block_size
                    None,  # lora_id
                    "GPU",  # medium
                    None,  # lora_name
                    [None, None],  # extra_keys, one per hash
                    0,  # group_idx
                ],
                ["BlockRemoved", [H1], "GPU", 0],  # tag, block_hashes, medium, group_idx
            ],
            0,
        ],
        0,
    ),
    (
        "0.22 arrays with kv_cache_spec kind and window (extra trailing fields)",
        [
            1.0,
            [
                [
                    "BlockStored",
                    [H1, H2],
                    None,
                    TOKENS,
                    16,
                    None,
                    "GPU",
                    None,
                    None,
                    0,
                    "full_attention",  # kv_cache_spec_kind
                    None,  # kv_cache_spec_sliding_window
                ]
            ],
            0,
        ],
        0,
    ),
    (
        "0.24 maps, defaults omitted",
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [H1, H2],
                    "parent_block_hash": None,
                    "token_ids": TOKENS,
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                },
                {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            0,
        ],
        0,
    ),
    (
        "0.33 maps with every newer field, plus one no version has",
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [H1, H2],
                    "parent_block_hash": None,
                    "token_ids": TOKENS,
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None, None],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                    "locality": "LOCAL",
                    "ownership": None,
                    "session_id": "s1",
                    "lookahead_token_ids": [[1], [2]],
                    "from_the_future": {"x": 1},
                }
            ],
            0,
            "trailing batch field from the future",
        ],
        0,
    ),
]


@pytest.mark.parametrize(("name", "batch", "rank"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_every_layout_decodes_to_the_same_blocks(name: str, batch: list[Any], rank: int) -> None:
    decoder = BatchDecoder()
    decoded = decoder.decode(encode(batch), 3)
    assert decoded.ts == batch[0]
    assert decoded.rank == rank
    stored = decoded.events[0]
    assert isinstance(stored, BlocksStored)
    assert stored.parent is None
    assert list(stored.token_ids) == TOKENS  # a list, or the fast path's array("I")
    assert stored.block_size == 16
    assert stored.table == TableKey("GPU", 0)
    if name.startswith("0.9.0"):
        assert stored.hashes == [(-5) & (2**64 - 1), 6]
        assert stored.signed_hashes
    else:
        assert stored.hashes == [H1, H2]
        assert not stored.signed_hashes


def test_one_decoder_follows_a_stream_that_changes_layout() -> None:
    decoder = BatchDecoder()
    for _, batch, _ in LAYOUTS * 2:
        assert decoder.decode(encode(batch), 0).events


def test_bytes_hash_and_its_int_form_are_one_block() -> None:
    raw = bytes(range(32))
    as_int = int.from_bytes(raw, "big") & (2**64 - 1)
    events, _ = decode(
        encode(
            [
                1.0,
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": [raw],
                        "parent_block_hash": raw[::-1],
                        "token_ids": TOKENS[:16],
                        "block_size": 16,
                        "lora_id": None,
                        "medium": "CPU",
                        "lora_name": None,
                    },
                    {"type": "BlockRemoved", "block_hashes": [as_int], "medium": "CPU"},
                ],
                0,
            ]
        )
    )
    stored, removed = events
    assert stored.hashes == [as_int]
    assert stored.raw_hashes == [raw]
    assert stored.parent == int.from_bytes(raw[::-1], "big") & (2**64 - 1)
    assert stored.raw_parent == raw[::-1]
    assert removed == BlocksRemoved([as_int], TableKey("CPU", 0))


def test_medium_none_is_gpu_and_group_none_is_zero() -> None:
    events, _ = decode(encode([1.0, [["BlockRemoved", [H1], None, None]], 0]))
    assert events == [BlocksRemoved([H1], TableKey("GPU", 0))]


def test_cpu_placeholder_store_keeps_its_tier_and_group() -> None:
    events, _ = decode(
        encode(
            [
                1.0,
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": [H3],
                        "parent_block_hash": None,
                        "token_ids": [],
                        "block_size": 0,
                        "lora_id": None,
                        "medium": "CPU",
                        "lora_name": None,
                        "group_idx": 2,
                    }
                ],
            ]
        )
    )
    assert events[0].table == TableKey("CPU", 2)
    assert len(events[0].token_ids) == 0


def test_unknown_event_type_costs_only_itself() -> None:
    events, errors = decode(
        encode(
            [
                1.0,
                [
                    {"type": "BlockMoved", "block_hashes": [H1]},
                    ["BlockRemoved", [H2], "GPU", 0],
                    {"type": "AllBlocksCleared"},
                ],
                0,
            ]
        )
    )
    assert events == [BlocksRemoved([H2], TableKey("GPU", 0)), AllCleared()]
    assert [e.kind for e in errors] == [MalformedKind.UNKNOWN_EVENT_TYPE]


@pytest.mark.parametrize(
    ("event", "why"),
    [
        ({"type": "BlockStored", "parent_block_hash": None}, "without block_hashes"),
        ({"type": "BlockRemoved", "block_hashes": "abc"}, "block_hashes is a str"),
        ({"type": "BlockRemoved", "block_hashes": [1.5]}, "block_hashes holds a float"),
        ({"type": "BlockRemoved", "block_hashes": [b""]}, "block hash b''"),
        (
            {"type": "BlockStored", "block_hashes": [1], "token_ids": ["a"], "block_size": 16},
            "token_ids",
        ),
        ("BlockStored", "an event is a str"),
    ],
)
def test_a_bad_event_refuses_its_whole_batch_with_a_reason(event: Any, why: str) -> None:
    with pytest.raises(MalformedPayload) as caught:
        decode(encode([1.0, [{"type": "AllBlocksCleared"}, event], 0]))
    assert caught.value.kind is MalformedKind.BAD_EVENT
    assert why in str(caught.value)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        encode({"ts": 1.0}),
        encode([1.0]),
        encode([1.0, "events"]),
    ],
)
def test_undecodable_payloads_raise_one_error_kind(payload: bytes) -> None:
    with pytest.raises(MalformedPayload) as caught:
        BatchDecoder().decode(payload, 0)
    assert caught.value.kind is MalformedKind.UNDECODABLE


@pytest.mark.parametrize(
    "batch",
    [
        ["ts", []],
        [True, []],
        [float("nan"), []],
        [float("inf"), [{"type": "AllBlocksCleared"}], 0],
        [-float("inf"), [["AllBlocksCleared"]]],
        [1.0, [], "rank"],
        [1.0, [], -1],
        [1.0, [], 2**63],
        [1.0, [], 1.0],
    ],
)
def test_a_bad_ts_or_rank_refuses_the_batch(batch: list[Any]) -> None:
    with pytest.raises(MalformedPayload) as caught:
        BatchDecoder().decode(encode(batch), 0)
    assert caught.value.kind is MalformedKind.BAD_BATCH
