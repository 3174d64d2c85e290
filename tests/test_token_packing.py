"""Packed token blocks have one layout, whichever way they are written: the bits of each token
in turn, little-endian, a block ending with zero bits. Lookups compare a query packed by
`pack_query` with a column's bytes, so both must follow it bit for bit."""

from __future__ import annotations

import random
from array import array

from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector._token_column import TokenColumn, _packed_ways, pack_query


def reference(tokens: list[int], width: int) -> bytes:
    """The layout, written the plain way."""
    bits = 0
    for i, token in enumerate(tokens):
        bits |= token << (i * width)
    return bits.to_bytes((len(tokens) * width + 7) // 8, "little")


@st.composite
def blocks(draw: st.DrawFn) -> tuple[list[int], int]:
    width = draw(st.integers(1, 32))
    tokens = draw(st.lists(st.integers(0, 2**width - 1), min_size=1, max_size=40))
    return tokens, width


@given(blocks())
def test_a_block_packs_to_its_bits_in_order(block: tuple[list[int], int]) -> None:
    tokens, width = block
    packed, usable = pack_query(array("I", tokens), len(tokens), width)
    assert usable == 1
    assert packed == reference(tokens, width)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64), st.integers(1, 8))
def test_a_column_gives_back_the_tokens_it_packed(tokens: list[int], block_size: int) -> None:
    tokens = tokens[: len(tokens) // block_size * block_size] or [0] * block_size
    column = TokenColumn()
    column.assign(block_size, array("I", tokens))
    assert column.to_uint32() == array("I", tokens)
    width = column.width
    for slot in range(len(tokens) // block_size):
        block = tokens[slot * block_size : (slot + 1) * block_size]
        assert pack_query(array("I", block), block_size, width)[0] == reference(block, width)


@st.composite
def columns(draw: st.DrawFn) -> tuple[list[int], int]:
    """Whole blocks of tokens below 2**width, for every width: a column's blocks lie end to
    end, and each token is read back with the bits around it masked off."""
    width = draw(st.integers(1, 32))
    block_size = draw(st.integers(1, 20))
    slots = draw(st.integers(1, 6))
    token = st.integers(0, 2**width - 1)
    tokens = draw(st.lists(token, min_size=block_size * slots, max_size=block_size * slots))
    return tokens, block_size


@given(columns())
def test_a_column_of_any_width_gives_back_its_tokens(column: tuple[list[int], int]) -> None:
    tokens, block_size = column
    packed = TokenColumn()
    packed.assign(block_size, array("I", tokens))
    assert packed.to_uint32() == array("I", tokens)


def test_pack_eight_tokens_a_step_writes_what_the_general_loop_writes() -> None:
    """`pack` (eight tokens a step, a copy of the step per width) against its general loop, for
    every width, odd and even counts, the widest tokens and random ones: the same bytes, the
    layout's, and not one byte written past them."""
    rng = random.Random(14)
    pad = 16
    for width in range(1, 33):
        top = 2**width - 1
        for n in range(0, 72):
            for tokens in ([top] * n, [rng.randint(0, top) for _ in range(n)]):
                fast, general = _packed_ways(array("I", tokens), width, pad)
                assert fast == general, (width, n)
                assert fast[: len(fast) - pad] == reference(tokens, width), (width, n)
                assert fast[len(fast) - pad :] == b"\xff" * pad, (width, n)


@given(
    st.integers(1, 32).flatmap(
        lambda w: st.tuples(st.just(w), st.lists(st.integers(0, 2**w - 1), max_size=300))
    )
)
def test_pack_of_any_tokens_is_the_general_loops(case: tuple[int, list[int]]) -> None:
    width, tokens = case
    fast, general = _packed_ways(array("I", tokens), width, 9)
    assert fast == general
    assert fast[: len(fast) - 9] == reference(tokens, width)
