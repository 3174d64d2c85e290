"""How far a stream's content reads a batch for its token runs (storage/_token_granules.pyx): its
first value only, nested to `MAX_DEPTH` (the collector's decoder's bound), what came before a
value it cannot read noted and nothing after. The walk holds no call per container, so these
bounds are its own to keep: each is pinned here as a case."""

from __future__ import annotations

import msgspec
import pytest

from kvscope.storage._token_granules import RunTable
from kvscope.storage.log_dictionary import GRANULE

MAX_DEPTH = 64
"""collector/_msgpack.pxd's bound on nesting."""
A = list(range(10, 10 + GRANULE))
B = list(range(50, 50 + GRANULE))


def run(tokens: list[int]) -> bytes:
    """The granule's bytes as the content holds them: the ids, without the array's header."""
    return msgspec.msgpack.encode(tokens)[-len(tokens) :]  # each of these ids takes a byte


def noted(payload: bytes) -> list[bytes]:
    table = RunTable(GRANULE)
    table.note([payload], 1, 1)
    return table.runs()


def nested(value: object, levels: int) -> object:
    """`value` inside `levels` arrays of one item."""
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [1, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 5])
def test_a_run_is_noted_down_to_the_deepest_level_read_and_none_below(depth: int) -> None:
    payload = msgspec.msgpack.encode(nested(A, depth))
    assert noted(payload) == ([run(A)] if depth <= MAX_DEPTH else [])


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH])
def test_a_map_s_keys_and_values_are_read_at_their_depth(depth: int) -> None:
    # A map's items lie one level below it, as an array's do.
    payload = msgspec.msgpack.encode(nested({"token_ids": A, "n": 1}, depth))
    assert noted(payload) == ([run(A)] if depth < MAX_DEPTH else [])


def test_a_value_too_deep_stops_the_walk_keeping_what_came_before() -> None:
    payload = msgspec.msgpack.encode([A, nested(1, MAX_DEPTH + 1), B])
    assert noted(payload) == [run(A)]
    # Empty containers hold nothing to read: that deep, they stop nothing.
    payload = msgspec.msgpack.encode([A, nested([], MAX_DEPTH - 1), {}, B])
    assert noted(payload) == [run(A), run(B)]


def test_only_the_first_value_is_read() -> None:
    assert noted(msgspec.msgpack.encode(A) + msgspec.msgpack.encode(B)) == [run(A)]
    assert noted(msgspec.msgpack.encode("x") + msgspec.msgpack.encode(B)) == []
    assert noted(msgspec.msgpack.encode([1, A]) + msgspec.msgpack.encode([B])) == [run(A)]


def test_a_value_cut_short_or_unreadable_keeps_what_came_before() -> None:
    whole = msgspec.msgpack.encode([A, {"k": "v" * 40}, B])
    assert noted(whole) == [run(A), run(B)]
    cut = whole.index(b"v" * 40) + 10
    assert noted(whole[:cut]) == [run(A)]
    never = whole.replace(b"\xa1k", b"\xc1k")  # 0xC1: no msgpack value starts so
    assert noted(never) == [run(A)]


@pytest.mark.parametrize("cut", [1, 2, 4])
def test_an_array_whose_last_id_is_cut_short_is_no_token_ids(cut: int) -> None:
    # Wide ids, so that the last granule lies within the widest ids' reach of the end: each
    # id's bytes are checked against the end there, not the granule's at once.
    wide = [70_000 + i for i in range(2 * GRANULE)]  # uint32: 5 bytes each
    whole = msgspec.msgpack.encode([A, wide])
    assert noted(whole) == [run(A), *runs_of_wide(wide)]
    assert noted(whole[:-cut]) == [run(A)]


def runs_of_wide(ids: list[int]) -> list[bytes]:
    body = msgspec.msgpack.encode(ids)[3:]  # past an array16's header
    return [body[i : i + 5 * GRANULE] for i in range(0, len(body), 5 * GRANULE)]
