"""The compiled map-layout decoder against the slow path (msgspec's decoders and the rules of
collector/wire_rules.py): whenever it returns a Batch, the slow path must accept the payload and
return the same Batch. What the slow path refuses, the fast one must therefore decline."""

from __future__ import annotations

import math
import random
import struct
from array import array
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from kvscope.collector import wire_rules as rules
from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.capture import read_capture
from kvscope.collector.limits import IngestLimits
from kvscope.collector.types import AllCleared, Batch, BlocksRemoved, BlocksStored
from kvscope.collector.wire import _TYPED_DECODERS, BatchDecoder, MapBlockStored
from tests.conftest import capture_path

MAX_BS = 64
"""The block size limit the tests decode with (small, so that generated batches cross it)."""


def reference(payload: bytes, seq: int) -> Batch:
    """What the slow path makes of a payload (it raises for one it refuses)."""
    return BatchDecoder(IngestLimits(max_block_size=MAX_BS))._decode_slow(payload, seq)


def assert_same(fast: Batch, slow: Batch) -> None:
    assert (fast.seq, fast.rank, fast.dropped_events) == (slow.seq, slow.rank, slow.dropped_events)
    assert fast.payload_bytes == slow.payload_bytes
    assert type(fast.rank) is type(slow.rank)
    assert struct.pack("<d", fast.ts) == struct.pack("<d", slow.ts)  # NaN too
    assert len(fast.events) == len(slow.events)
    for f, s in zip(fast.events, slow.events, strict=True):
        assert type(f) is type(s)
        if type(f) is BlocksStored:
            assert type(s) is BlocksStored
            assert type(f.token_ids) is array and f.token_ids.typecode == "I"
            assert list(f.token_ids) == list(s.token_ids)
            assert f.table == s.table
            assert msgspec.structs.replace(f, token_ids=[]) == msgspec.structs.replace(
                s, token_ids=[]
            )
        elif type(f) is BlocksRemoved:
            assert type(s) is BlocksRemoved
            assert f.table == s.table
            assert f.hashes == s.hashes
        else:
            assert f == s == AllCleared()


def check(payload: bytes, seq: int = 3) -> Batch | None:
    """The fast result; when it is a Batch, the slow path must accept the payload and agree."""
    fast = decode_map_batch(payload, seq, MAX_BS)
    if fast is not None:
        assert_same(fast, reference(payload, seq))
    return fast


# --- a msgpack writer that picks any valid width (msgspec always writes the smallest) ---------
def _sized(
    n: int, fix: int | None, fix_max: int, wide: dict[int, str], rnd: random.Random
) -> bytes:
    """A header for `n` items: the fix form (`fix | n`) or a wide one (code: length format)."""
    options = [bytes([fix | n])] if fix is not None and n <= fix_max else []
    for code, fmt in wide.items():
        if n < 1 << (8 * struct.calcsize(fmt)):
            options.append(bytes([code]) + struct.pack(fmt, n))
    return rnd.choice(options)


def _int(v: int, rnd: random.Random) -> bytes:
    options = []
    if 0 <= v < 128 or -32 <= v < 0:
        options.append(struct.pack(">b" if v < 0 else ">B", v))
    for code, fmt in zip(range(0xCC, 0xD0), "BHIQ", strict=True):
        if 0 <= v < 1 << (8 * struct.calcsize(fmt)):
            options.append(bytes([code]) + struct.pack(">" + fmt, v))
    for code, fmt in zip(range(0xD0, 0xD4), "bhiq", strict=True):
        bits = 8 * struct.calcsize(fmt) - 1
        if -(1 << bits) <= v < 1 << bits:
            options.append(bytes([code]) + struct.pack(">" + fmt, v))
    return rnd.choice(options)


def pack(value: Any, rnd: random.Random) -> bytes:
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if type(value) is int:
        return _int(value, rnd)
    if type(value) is float:
        f32 = struct.pack(">f", value) if abs(value) < 3e38 or value != value else b""
        if f32 and value == value and struct.unpack(">f", f32)[0] == value and rnd.random() < 0.5:
            return b"\xca" + f32
        return b"\xcb" + struct.pack(">d", value)
    if type(value) is str:
        data = value.encode()
        return _sized(len(data), 0xA0, 31, {0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}, rnd) + data
    if type(value) is bytes:
        return _sized(len(value), None, 0, {0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}, rnd) + value
    if type(value) is Ext:
        data, code = bytes(value.data), struct.pack(">b", value.code)
        size = len(data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if size in fixed and rnd.random() < 0.5:
            return bytes([fixed[size]]) + code + data
        return _sized(size, None, 0, {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}, rnd) + code + data
    if type(value) is list:
        head = _sized(len(value), 0x90, 15, {0xDC: ">H", 0xDD: ">I"}, rnd)
        return head + b"".join(pack(v, rnd) for v in value)
    assert type(value) is dict
    head = _sized(len(value), 0x80, 15, {0xDE: ">H", 0xDF: ">I"}, rnd)
    return head + b"".join(pack(k, rnd) + pack(v, rnd) for k, v in value.items())


# --- vLLM-shaped batches (0.24 to 0.33), and wilder ones ---------------------------------------
def _widths(top: int) -> st.SearchStrategy[int]:
    """Non-negative ints below 2**top, spread over every msgpack int width."""
    bounds = [b for b in (7, 8, 16, 32) if b < top] + [top]
    return st.one_of(
        [
            st.integers(0 if i == 0 else 1 << bounds[i - 1], (1 << b) - 1)
            for i, b in enumerate(bounds)
        ]
    )


U64 = _widths(64)
U32 = _widths(32)
I64 = st.one_of(_widths(63), st.integers(-(1 << 63), -1))
ANY_INT = st.integers(-(1 << 63), (1 << 64) - 1)
KNOWN = {"type", *MapBlockStored.__struct_fields__}
ANYTHING = st.recursive(
    st.none()
    | st.booleans()
    | ANY_INT
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(Ext, st.integers(-128, 127), st.binary(max_size=20)),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(st.text(max_size=6) | ANY_INT, kids, max_size=4)
    ),
    max_leaves=12,
)
UNKNOWN_KEY = st.text(min_size=1, max_size=24).filter(lambda k: k not in KNOWN)
MEDIUM = st.none() | st.sampled_from(["GPU", "CPU", "disk", ""]) | st.text(max_size=8)
GROUP = st.none() | st.sampled_from([0, 1]) | st.integers(0, rules.MAX_GROUP)
RANK = st.none() | st.integers(0, rules.MAX_RANK)
NAME = st.none() | st.sampled_from(["full_attention", "sliding_window", "local"]) | st.text()
TS = st.floats(-rules.MAX_ABS_TS, rules.MAX_ABS_TS) | st.sampled_from([rules.MAX_ABS_TS, 1.7e9])
BLOCK_SIZE = st.sampled_from([0, 1, 16, MAX_BS]) | st.integers(0, MAX_BS)
# Values at the edges of the rules (collector/wire_rules.py), for the wild batches.
EDGE_BLOCK_SIZE = st.sampled_from([-1, MAX_BS + 1, 2**63 - 1, 2**63, 2**64 - 1])
EDGE_MEDIUM = st.sampled_from(["x" * 32, "x" * 33, "é" * 16, "é" * 17])
EDGE_GROUP = st.sampled_from([-1, rules.MAX_GROUP, rules.MAX_GROUP + 1, 2**63])
EDGE_RANK = st.sampled_from([-1, rules.MAX_RANK, rules.MAX_RANK + 1, 2**64 - 1])
EDGE_LORA = st.sampled_from(["x" * 256, "x" * 257, "é" * 129])
EDGE_TS = st.sampled_from([math.nan, math.inf, -math.inf, 2.0**53 * 2, -1e300, 2**63, 2**64 - 1])
NOTHING = st.nothing()


def _optional(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> list[tuple[str, Any]]:
    return [(k, draw(s)) for k, s in fields.items() if draw(st.booleans())]


@st.composite
def token_ids(draw: st.DrawFn, block_size: int, blocks: int, wild: bool) -> list[int]:
    """As many as vLLM sends: none, block_size per hash, or whole blocks more (skipped null
    blocks); wild, any number off by a few."""
    forms = [0, block_size * blocks]
    if block_size:
        forms.append(block_size * (blocks + draw(st.integers(1, 2))))
    n = draw(st.sampled_from(forms))
    if wild and draw(st.integers(0, 3)) == 0:
        n = max(0, n + draw(st.integers(-2, 2)))
    return draw(st.lists(U32 | (ANY_INT if wild else st.nothing()), min_size=n, max_size=n))


@st.composite
def event(draw: st.DrawFn, wild: bool) -> Any:
    def v(good: st.SearchStrategy[Any], edge: st.SearchStrategy[Any] = NOTHING) -> Any:
        return st.one_of(good, edge, ANYTHING) if wild else good

    hash_ = v(U64 | st.integers(-(1 << 63), -1) | st.binary(max_size=9)) if wild else U64
    tag = draw(st.sampled_from(["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]))
    items: list[tuple[str, Any]] = [("type", tag)]
    if tag == "BlockStored":
        hashes = draw(st.lists(hash_, max_size=6))
        size = draw(v(BLOCK_SIZE, EDGE_BLOCK_SIZE))
        n = len(hashes)
        tokens = token_ids(size if type(size) is int and 0 <= size <= MAX_BS else 16, n, wild)
        extra = st.none() | st.just([None] * n)
        if wild:
            extra |= st.lists(st.none(), max_size=6) | st.just([["salt"]] * n)
        items += [("block_hashes", hashes), ("block_size", size)]  # vLLM always sends both
        items += _optional(
            draw,
            {
                "parent_block_hash": st.none() | hash_,
                "token_ids": v(tokens),
                "lora_id": v(st.none() | ANY_INT),
                "medium": v(MEDIUM, EDGE_MEDIUM),
                "lora_name": v(st.none() | st.text(max_size=8), EDGE_LORA),
                "extra_keys": v(extra),
                "group_idx": v(GROUP, EDGE_GROUP),
                "kv_cache_spec_kind": NAME,
                "kv_cache_spec_sliding_window": st.none() | ANY_INT,
                "locality": NAME,
                "ownership": NAME,
                "session_id": NAME,
                "lookahead_token_ids": st.none() | st.lists(st.lists(U32, max_size=4), max_size=3),
            },
        )
    elif tag == "BlockRemoved":
        items.append(("block_hashes", draw(st.lists(hash_, min_size=1, max_size=3))))
        items += _optional(
            draw,
            {
                "medium": v(MEDIUM, EDGE_MEDIUM),
                "group_idx": v(GROUP, EDGE_GROUP),
                "locality": NAME,
                "ownership": NAME,
            },
        )
    items += draw(st.lists(st.tuples(UNKNOWN_KEY, ANYTHING), max_size=3))
    items = draw(st.permutations(items))
    if wild:
        mangle = draw(st.integers(0, 9))
        if mangle == 0:  # the old array layout
            return [tag, *(value for _, value in items)]
        if mangle == 1 and items:  # a required key goes missing
            del items[draw(st.integers(0, len(items) - 1))]
        if mangle == 2:
            items.append(("type", draw(st.sampled_from(["BlockStored", "Other", ""]) | ANYTHING)))
    return dict(items)


@st.composite
def batch(draw: st.DrawFn, wild: bool = False) -> list[Any]:
    ts = draw(TS | (EDGE_TS | ANYTHING if wild else st.nothing()))
    events = draw(st.lists(event(wild), max_size=8))
    out: list[Any] = [ts, events]
    if draw(st.booleans()):
        out.append(draw(RANK | (EDGE_RANK | ANYTHING if wild else st.nothing())))
    if wild and draw(st.integers(0, 5)) == 0:
        out = out[: draw(st.integers(0, 3))] + draw(st.lists(ANYTHING, max_size=2))
    return out


def encoded(data: st.DataObject, value: Any) -> bytes:
    if data.draw(st.booleans()):
        return msgspec.msgpack.encode(value)
    return pack(value, random.Random(data.draw(st.integers(0, 2**32))))


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data())
def test_every_vllm_shaped_batch_decodes_fast_to_the_slow_paths_batch(data: st.DataObject) -> None:
    payload = encoded(data, data.draw(batch()))
    assert check(payload) is not None


@SETTINGS
@given(st.data())
def test_any_batch_decodes_fast_to_the_slow_paths_batch_or_falls_back(data: st.DataObject) -> None:
    check(encoded(data, data.draw(batch(wild=True))))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_truncation_falls_back(data: st.DataObject) -> None:
    payload = encoded(data, data.draw(batch()))
    for end in range(len(payload)):
        assert decode_map_batch(payload[:end], 0, MAX_BS) is None


@SETTINGS
@given(st.data())
def test_corrupted_bytes_never_crash_nor_mislead(data: st.DataObject) -> None:
    payload = bytearray(encoded(data, data.draw(batch())))
    for _ in range(data.draw(st.integers(1, 3))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    check(bytes(payload))


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
        assert list(fast.events[0].token_ids) == tokens[:n_tokens]
        assert fast.events[1].hashes == hashes[:n_hashes] * 2
    long = dict(STORED, block_hashes=hashes, token_ids=tokens[: 16 * 300])
    assert check(E([1.0, [long], 0])) is not None
    for bad in (2**32, -1, "x"):
        assert check(E([1.0, [dict(long, token_ids=[*tokens[: 16 * 300 - 1], bad])], 0])) is None
        assert check(E([1.0, [dict(STORED, token_ids=[*tokens[:31], bad])], 0])) is None
    for bad in (-1, "x", None):
        assert check(E([1.0, [dict(long, block_hashes=[*hashes[:-1], bad])], 0])) is None
        assert check(E([1.0, [dict(STORED, block_hashes=[1, bad])], 0])) is None


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


# --- what vLLM 0.33 really sent ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lab_3rps_180s", "lab_10rps_300s"])
def test_every_captured_payload_decodes_fast_to_todays_batch(name: str) -> None:
    rnd = random.Random(name)
    for i, record in enumerate(read_capture(capture_path(f"{name}.msgpack.gz"))):
        assert check(record.payload, record.seq) is not None
        if i % 20 == 0:  # and a few corrupted copies of it
            for _ in range(10):
                bad = bytearray(record.payload)
                bad[rnd.randrange(len(bad))] = rnd.randrange(256)
                check(bytes(bad))
