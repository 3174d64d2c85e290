"""Hypothesis strategies for vLLM-shaped event batches (0.24 to 0.33) and wilder ones."""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from kvscope.collector import wire_rules as rules
from kvscope.collector.wire import MapBlockStored
from tests.wire_fast_support import MAX_BS, pack


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
        extra: st.SearchStrategy[list[None] | list[list[str]] | None] = st.none() | st.just(
            [None] * n
        )
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
