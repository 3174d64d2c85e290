"""Hostile batches (issue 12's fuzzing review) and the real shapes vLLM sends, through every
decode path: a known event that breaks a rule refuses its whole batch with a kind, nothing else
escapes the decoder, and no real batch is refused."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector import wire
from kvscope.collector import wire_rules as rules
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.limits import IngestLimits
from kvscope.collector.types import AllCleared, BlocksRemoved, BlocksStored, TableKey
from kvscope.collector.wire import BatchDecoder
from tests.wire_fast_strategies import SETTINGS, batch, encoded

E = msgspec.msgpack.encode
GOOD = {"type": "BlockStored", "block_hashes": [1, 2], "token_ids": [5] * 32, "block_size": 16}
CLEARED = {"type": "AllBlocksCleared"}


def as_array(event: dict[str, Any]) -> list[Any]:
    """The same event in vLLM <= 0.23's array layout."""
    names: tuple[str, ...] = ("block_hashes", "parent_block_hash", "token_ids", "block_size")
    names += ("lora_id", "medium", "lora_name", "extra_keys", "group_idx")
    if event["type"] == "BlockRemoved":
        names = ("block_hashes", "medium", "group_idx")
    return [event["type"], *(event.get(name) for name in names)]


def refused(batch: list[Any]) -> MalformedPayload:
    with pytest.raises(MalformedPayload) as caught:
        BatchDecoder().decode(E(batch), 0)
    return caught.value


HOSTILE: list[tuple[str, dict[str, Any], MalformedKind, str]] = [
    (
        "type is a list",
        {"type": ["BlockStored"], "block_hashes": [1]},
        MalformedKind.BAD_EVENT,
        "type",
    ),
    ("token_ids nil", dict(GOOD, token_ids=None), MalformedKind.BAD_EVENT, "token_ids"),
    ("block_size nil", dict(GOOD, block_size=None), MalformedKind.BAD_EVENT, "block_size"),
    (
        "block_size 2**63",
        dict(GOOD, block_size=2**63),
        MalformedKind.LIMIT_EXCEEDED,
        "max_block_size",
    ),
    (
        "block_size 65536",
        dict(GOOD, block_size=65_536),
        MalformedKind.LIMIT_EXCEEDED,
        "max_block_size",
    ),
    ("block_size -1", dict(GOOD, block_size=-1), MalformedKind.BAD_EVENT, "block_size"),
    ("block_size a bool", dict(GOOD, block_size=True), MalformedKind.BAD_EVENT, "block_size"),
    (
        "a token id 2**32",
        dict(GOOD, token_ids=[5] * 31 + [2**32]),
        MalformedKind.BAD_EVENT,
        "token",
    ),
    ("a token id -1", dict(GOOD, token_ids=[5] * 31 + [-1]), MalformedKind.BAD_EVENT, "token"),
    (
        "a token id a bool",
        dict(GOOD, token_ids=[5] * 31 + [True]),
        MalformedKind.BAD_EVENT,
        "token",
    ),
    ("a token short", dict(GOOD, token_ids=[5] * 31), MalformedKind.BAD_EVENT, "31 token_ids"),
    ("tokens, size 0", dict(GOOD, block_size=0), MalformedKind.BAD_EVENT, "32 token_ids"),
    ("a bool hash", dict(GOOD, block_hashes=[1, True]), MalformedKind.BAD_EVENT, "block_hashes"),
    ("empty bytes hash", dict(GOOD, block_hashes=[1, b""]), MalformedKind.BAD_EVENT, "block hash"),
    (
        "65-byte hash",
        dict(GOOD, block_hashes=[1, b"h" * 65]),
        MalformedKind.BAD_EVENT,
        "block hash",
    ),
    ("parent a str", dict(GOOD, parent_block_hash="p"), MalformedKind.BAD_EVENT, "parent"),
    ("medium an int", dict(GOOD, medium=1), MalformedKind.BAD_EVENT, "medium"),
    ("medium too long", dict(GOOD, medium="M" * 33), MalformedKind.BAD_EVENT, "medium"),
    ("group -1", dict(GOOD, group_idx=-1), MalformedKind.BAD_EVENT, "group_idx"),
    ("group 65536", dict(GOOD, group_idx=65_536), MalformedKind.BAD_EVENT, "group_idx"),
    ("lora_name too long", dict(GOOD, lora_name="é" * 129), MalformedKind.BAD_EVENT, "lora_name"),
    ("lora_id a str", dict(GOOD, lora_id="x"), MalformedKind.BAD_EVENT, "lora_id"),
    ("extra_keys short", dict(GOOD, extra_keys=[None]), MalformedKind.BAD_EVENT, "extra_keys"),
    (
        "extra key a map",
        dict(GOOD, extra_keys=[None, [{"a": 1}]]),
        MalformedKind.BAD_EVENT,
        "extra",
    ),
    (
        "extra key too long",
        dict(GOOD, extra_keys=[["s" * 4097], None]),
        MalformedKind.BAD_EVENT,
        "extra",
    ),
    (
        "removal hashes nil",
        {"type": "BlockRemoved", "block_hashes": None},
        MalformedKind.BAD_EVENT,
        "block_hashes",
    ),
    (
        "removal group a str",
        {"type": "BlockRemoved", "block_hashes": [1], "group_idx": "0"},
        MalformedKind.BAD_EVENT,
        "group_idx",
    ),
]


@pytest.mark.parametrize("layout", ["map", "array"])
@pytest.mark.parametrize(("name", "event", "kind", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_event_refuses_its_whole_batch(
    layout: str, name: str, event: dict[str, Any], kind: MalformedKind, why: str
) -> None:
    if layout == "array" and type(event["type"]) is not str:
        event = dict(event, type="BlockStored", block_hashes=[[1]])  # an array's tag is a str
        kind, why = MalformedKind.BAD_EVENT, "block_hashes"
    shaped = as_array(event) if layout == "array" else event
    good = as_array(GOOD) if layout == "array" else GOOD
    error = refused([1.0, [good, CLEARED, shaped, good], 0])
    assert error.kind is kind
    assert why in error.detail


def test_every_field_at_its_bound_is_accepted() -> None:
    event = dict(
        GOOD,
        block_hashes=[2**64 - 1, -(2**63), b"h" * rules.MAX_HASH_BYTES],
        token_ids=[2**32 - 1] * 3 * 16,
        medium="é" * 16,  # 32 bytes
        group_idx=rules.MAX_GROUP,
        lora_name="x" * rules.MAX_LORA_NAME_BYTES,
        extra_keys=[["s" * 4096, ["mm-id", -3]], None, [b"d" * 32]],
    )
    batch = BatchDecoder().decode(E([1.0, [event], rules.MAX_RANK]), 0)
    stored = batch.events[0]
    assert type(stored) is BlocksStored and stored.signed_hashes
    assert stored.table == TableKey("é" * 16, rules.MAX_GROUP)
    big = dict(GOOD, block_size=16_384, block_hashes=[1], token_ids=[7] * 16_384)
    assert BatchDecoder().decode(E([1.0, [big], 0]), 0).events[0].block_size == 16_384  # type: ignore[union-attr]
    small = BatchDecoder(IngestLimits(max_block_size=8))
    with pytest.raises(MalformedPayload) as caught:
        small.decode(E([1.0, [GOOD], 0]), 0)
    assert caught.value.kind is MalformedKind.LIMIT_EXCEEDED


@pytest.mark.parametrize(
    ("name", "event", "blocks", "tokens"),
    [
        # CPU offload placeholders (vLLM's OffloadingEventsTracker._placeholder_stored)
        (
            "placeholder",
            dict(GOOD, block_hashes=[9], token_ids=[], block_size=0, medium="CPU"),
            1,
            0,
        ),
        # Mooncake / the simple offload connector without tokens: [] with the real size
        ("no tokens", dict(GOOD, token_ids=[], medium="cpu"), 2, 0),
        # BlockPool.cache_full_blocks skips null and masked blocks (sliding window, Mamba)
        # but sends the tokens of every block it walked
        ("skipped blocks", dict(GOOD, block_hashes=[1], token_ids=[5] * 48), 1, 48),
        ("all skipped", dict(GOOD, block_hashes=[], token_ids=[5] * 16), 0, 16),
        # a partial block (BlockPool's partial-block caching): its own size
        ("partial", dict(GOOD, block_hashes=[3], token_ids=[5] * 5, block_size=5), 1, 5),
        # a hybrid model's attention block
        ("hybrid", dict(GOOD, block_hashes=[4], token_ids=[5] * 2096, block_size=2096), 1, 2096),
    ],
)
def test_what_real_vllm_sends_is_accepted(
    name: str, event: dict[str, Any], blocks: int, tokens: int
) -> None:
    for shaped in (event, as_array(event)):
        batch = BatchDecoder().decode(E([1.0, [shaped], 0]), 0)
        stored = batch.events[0]
        assert type(stored) is BlocksStored
        assert (len(stored.hashes), len(stored.token_ids)) == (blocks, tokens)


@pytest.mark.parametrize("layout", ["map", "array"])
def test_an_unknown_event_type_is_counted_and_skipped_the_rest_applies(layout: str) -> None:
    inactive: Any = {"type": "BlockInactive", "block_hashes": [1], "medium": "GPU"}
    removed: Any = {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}
    if layout == "array":
        inactive, removed = ["BlockInactive", [1]], as_array(removed)
    errors: list[MalformedPayload] = []
    batch = BatchDecoder().decode(E([1.0, [inactive, removed, CLEARED], 0]), 0, errors)
    assert batch.events == [BlocksRemoved([2], TableKey("GPU", 0)), AllCleared()]
    assert batch.dropped_events == 1
    assert [e.kind for e in errors] == [MalformedKind.UNKNOWN_EVENT_TYPE]


def nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


@pytest.mark.parametrize(
    "payload",
    [
        b"\x93\xcb" + bytes(8) + b"\x91" + nested(2000) + b"\x00",  # an event 2,000 deep
        b"\x93\xcb" + bytes(8) + b"\x91\x82\xa4type\xabBlockStored\xa1x" + nested(5000) + b"\x00",
        b"\x92\xcb" + bytes(8) + nested(100_000),  # the events themselves
        b"\x92" + nested(3000) + b"\x90",  # the ts
    ],
)
def test_deep_nesting_is_a_malformed_payload_not_a_recursion_error(payload: bytes) -> None:
    with pytest.raises(MalformedPayload):
        BatchDecoder().decode(payload, 0)


def test_table_keys_interned_are_bounded() -> None:
    decoder = BatchDecoder()
    for group in range(0, 3000, 50):
        removals = [
            {"type": "BlockRemoved", "block_hashes": [1], "group_idx": group + k} for k in range(50)
        ]
        decoder.decode(E([1.0, removals, 0]), group)
    assert len(wire._table_keys) <= wire.MAX_INTERNED_KEYS
    # Past the bound keys are equal, not identical: consecutive removals still merge.
    twice = [{"type": "BlockRemoved", "block_hashes": [h], "group_idx": 60_000} for h in (1, 2)]
    for payload in (E([1.0, twice, 0]), E([1.0, [as_array(e) for e in twice], 0])):
        assert BatchDecoder().decode(payload, 0).events == [
            BlocksRemoved([1, 2], TableKey("GPU", 60_000))
        ]


@SETTINGS
@given(st.data())
def test_nothing_but_a_malformed_payload_leaves_the_decoder(data: st.DataObject) -> None:
    payload = bytearray(encoded(data, data.draw(batch(wild=True))))
    for _ in range(data.draw(st.integers(0, 2))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MalformedPayload):
        BatchDecoder().decode(bytes(payload), 0, [])


@pytest.mark.parametrize("ts", [2**64 - 1, 2**63, -(2**63), 1e300, -1e300, 2.0**53 * 2])
def test_a_ts_past_the_bound_is_a_bad_batch(ts: float) -> None:
    # Issue 12's fuzz run: `[2**64 - 1, [], 0]` (12 bytes) was accepted, and the store's writer
    # thread died on its rollup second, past SQLite's 64-bit INTEGER; `1e300` did the same
    # through the compiled path.
    for events in ([], [GOOD]):
        error = refused([ts, events, 0])
        assert error.kind is MalformedKind.BAD_BATCH and "ts" in error.detail


def test_a_ts_at_the_bound_is_accepted() -> None:
    for ts in (rules.MAX_ABS_TS, -rules.MAX_ABS_TS, int(rules.MAX_ABS_TS)):
        assert BatchDecoder().decode(E([ts, [GOOD], 0]), 0).ts == ts
