"""The fused replay (collector/_replay.pyx) against today's decode + apply: on any stream of
logged batches it must leave the same map, table for table and slot for slot, with the same
counters, and refuse (raise) where they refuse."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector._replay import replay
from kvscope.collector.capture import read_capture
from kvscope.collector.errors import MalformedPayload
from kvscope.collector.limits import IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from tests.conftest import capture_path
from tests.wire_fast_strategies import SETTINGS
from tests.wire_fast_support import MAX_BS, pack

STREAM = StreamId("r", 0)
EPOCH = 7
LIMITS = [
    IngestLimits(max_block_size=MAX_BS),
    IngestLimits(max_block_size=MAX_BS, max_blocks_per_stream=40),  # near it: admit counts
    IngestLimits(max_block_size=MAX_BS, max_tables_per_stream=3),
    IngestLimits(max_block_size=MAX_BS, max_token_bytes_per_stream=3000),
]


def map_state(prefix_map: PrefixMap) -> dict[str, Any]:
    """Everything a rebuilt map's readers can see, down to the slots its tables hand out."""
    tables = {}
    for key, table in prefix_map.tables.items():
        state = table.to_state()
        state["hashes"], state["slots"] = state["hashes"].tobytes(), state["slots"].tobytes()
        state["columns"] = [column.tobytes() for column in state["columns"]]
        state["free"] = state["free"].tobytes()
        state["entries"] = list(table.entries())
        state["stats"] = table.stats()
        state["side_bytes"] = table.side_bytes
        tables[(key.medium, key.group)] = (key, state)
    return {
        "order": [(key.medium, key.group) for key in prefix_map.tables],
        "tables": tables,
        "counters": prefix_map.counters.as_dict(),
        "totals": prefix_map.totals(),
    }


def run(payloads: list[tuple[int, bytes]], limits: IngestLimits, fused: bool) -> Any:
    """The map after `payloads`, and the refusal that stopped them if one did."""
    prefix_map = PrefixMap(STREAM)
    prefix_map.limits = limits
    refused = None
    try:
        if fused:
            assert replay(prefix_map, iter(payloads), EPOCH) == len(payloads)
        else:
            decode = BatchDecoder(limits).decode
            for seq, payload in payloads:
                prefix_map.apply(decode(payload, seq), EPOCH)
    except MalformedPayload as exc:
        refused = (exc.kind, exc.detail)
    return map_state(prefix_map), refused


def assert_same_replay(payloads: list[tuple[int, bytes]], limits: IngestLimits) -> None:
    fused, today = run(payloads, limits, True), run(payloads, limits, False)
    assert fused[1] == today[1]
    assert fused[0] == today[0]


# --- random streams -----------------------------------------------------------------------------
# Few hashes, so that stores repeat, removals hit and miss, parents come and go (orphans).
HASH = st.integers(0, 24) | st.sampled_from([2**64 - 1, 2**63, 1 << 40])
MEDIUM = st.sampled_from([None, "GPU", "CPU", "CPU_PINNED"])
GROUP = st.sampled_from([None, 0, 1])


@st.composite
def stored(draw: st.DrawFn, long: bool) -> dict[str, Any]:
    n = draw(st.integers(257, 300)) if long else draw(st.integers(0, 5))
    hashes = [draw(HASH) for _ in range(n)]
    size = draw(st.sampled_from([4, 4, 4, 8, 0]))
    blocks = draw(st.sampled_from([n, n, n, n + 1, 0]))  # whole blocks more: none kept
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": hashes, "block_size": size}
    if draw(st.booleans()):
        event["token_ids"] = [draw(st.integers(0, 2**32 - 1)) for _ in range(size * blocks)]
    if draw(st.booleans()):
        event["parent_block_hash"] = draw(st.none() | HASH)
    for name, value in (("medium", MEDIUM), ("group_idx", GROUP)):
        if draw(st.booleans()):
            event[name] = draw(value)
    if draw(st.integers(0, 3)) == 0:
        event["extra_keys"] = [None] * n
    if draw(st.integers(0, 3)) == 0:
        event["lora_id"] = draw(st.none() | st.integers(0, 5))
    if draw(st.integers(0, 5)) == 0:
        event["kv_cache_spec_kind"] = "full_attention"  # unknown keys are skipped
    return event


@st.composite
def removed(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockRemoved",
        "block_hashes": draw(st.lists(HASH, min_size=1, max_size=4)),
    }
    for name, value in (("medium", MEDIUM), ("group_idx", GROUP)):
        if draw(st.booleans()):
            event[name] = draw(value)
    return event


@st.composite
def odd(draw: st.DrawFn) -> Any:
    """An event the fused path leaves to decode + apply (the batch with it falls back)."""
    hashes = draw(st.lists(HASH, min_size=1, max_size=3))
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return {"type": "BlockStored", "block_hashes": hashes, "lora_name": "adapter"}
    if kind == 1:
        return {"type": "BlockStored", "block_hashes": hashes, "extra_keys": [["mm"]] * len(hashes)}
    if kind == 2:
        return {"type": "BlockRemoved", "block_hashes": [h.to_bytes(8, "big") for h in hashes]}
    if kind == 3:
        return ["BlockStored", hashes, None, [], 0]  # the array layout
    signed = [-1 - h % 2**62 for h in hashes]
    return {"type": "BlockStored", "block_hashes": signed, "block_size": 0}


@st.composite
def batch(draw: st.DrawFn) -> list[Any]:
    events = []
    for _ in range(draw(st.integers(0, 10))):
        pick = draw(st.integers(0, 40))
        if pick < 18:
            events.append(draw(stored(long=pick == 0)))
        elif pick < 36:
            events.append(draw(removed()))
        elif pick < 39:
            events.append({"type": "AllBlocksCleared"})
        else:
            events.append(draw(odd()))
    out: list[Any] = [draw(st.floats(1.7e9, 1.7e9 + 100)), events]
    if draw(st.booleans()):
        out.append(draw(st.none() | st.integers(0, 3)))
        if draw(st.integers(0, 9)) == 0:
            out.append("a later vLLM's field")
    return out


def encode(data: st.DataObject, value: Any) -> bytes:
    if data.draw(st.booleans()):
        return msgspec.msgpack.encode(value)
    return pack(value, random.Random(data.draw(st.integers(0, 2**32))))


@SETTINGS
@given(st.data())
def test_fused_replay_leaves_todays_map(data: st.DataObject) -> None:
    batches = data.draw(st.lists(batch(), max_size=12))
    first = data.draw(st.integers(0, 9))
    payloads = [(seq, encode(data, b)) for seq, b in enumerate(batches, first)]
    assert_same_replay(payloads, data.draw(st.sampled_from(LIMITS)))


def test_a_refused_batch_refuses_the_replay_where_apply_refuses() -> None:
    chain = {"type": "BlockStored", "block_hashes": list(range(30)), "block_size": 0}
    payloads = [(s, msgspec.msgpack.encode([1.0 + s, [chain]])) for s in range(3)]
    payloads.append((3, b"\x93\xcb"))  # cut short: undecodable
    assert_same_replay(payloads, LIMITS[0])
    assert run(payloads, LIMITS[0], True)[1] is not None


def test_a_store_of_no_blocks_without_token_ids_replays_as_decoded() -> None:
    # It passes the token count (0 == 0 * 16) though it has no token_ids to read.
    empty = {"type": "BlockStored", "block_hashes": [], "block_size": 16, "parent_block_hash": 7}
    chain = {"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16}
    chain["token_ids"] = list(range(32))
    assert_same_replay([(0, msgspec.msgpack.encode([1.0, [empty, chain]]))], LIMITS[0])


# --- what vLLM 0.33 really sent -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lab_3rps_180s", "lab_10rps_300s"])
def test_captured_streams_replay_to_todays_map(name: str) -> None:
    records = [(r.seq, r.payload) for r in read_capture(capture_path(f"{name}.msgpack.gz"))]
    for end in (len(records) // 3, len(records)):  # midway too
        assert_same_replay(records[:end], IngestLimits())


# --- a payload cut anywhere -----------------------------------------------------------------------
@SETTINGS
@given(st.data())
def test_a_payload_cut_anywhere_replays_as_decoded(data: st.DataObject) -> None:
    # Every end of the bytes, within a token id, a hash or a field the scan steps over on its
    # quick paths (ints of each width, short strs, nils) as well as between them.
    events = data.draw(st.lists(stored(long=False) | removed(), min_size=1, max_size=3))
    payload = encode(data, [1.7e9, events])
    limits = data.draw(st.sampled_from(LIMITS))
    for end in range(len(payload) + 1):
        assert_same_replay([(0, payload[:end])], limits)
