"""A table packs its tokens at the bit width of the largest it holds (collector/_token_column.pyx)
and answers as if they were plain uint32s: through widenings, lookups and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._checkpoint_columns import intern_records
from kvscope.collector.block_table import BlockTable
from kvscope.collector.token_query import TokenQuery
from kvscope.collector.token_records import TokenRecords
from kvscope.collector.types import TableKey

GPU0 = TableKey("GPU", 0)
SENTINEL = 2**64 - 1
"""The reference's own block: an orphan (its parent is never stored) of the widest tokens, so the
reference holds every token at 32 bits from the start and no lookup reaches the sentinel."""


def _interned_as_plain(table: BlockTable) -> None:
    """A state's tokens interned from the packed column: as the plain column interns."""
    tokens = table.to_state(interned_tokens=True)["columns"][-1]
    plain = table._tokens
    if not isinstance(tokens, TokenRecords):  # (no block size yet: the column as it is)
        assert bytes(tokens) == plain.tobytes()
        return
    numbers, records = intern_records(memoryview(plain).cast("B"), 4 * table.block_size)
    assert (tokens.numbers, bytes(tokens.records)) == (numbers, bytes(records))


def _checkpointed(table: BlockTable) -> BlockTable:
    _interned_as_plain(table)
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(table.to_state()))
    restored = BlockTable.from_state(state)
    assert restored._tokens == table._tokens  # the seam gives and takes uint32 tokens
    assert restored.token_bytes() == table.token_bytes()
    return restored


@dataclass
class Model:
    """Plain bookkeeping: hash -> [copies, tokens], and every block ever stored for queries."""

    cached: dict[int, list[object]] = field(default_factory=dict)
    ever: dict[int, tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)

    def path(self, block_hash: int) -> list[int]:
        """The tokens of `block_hash`'s chain, from its first stored ancestor down."""
        blocks: list[tuple[int, ...]] = []
        seen: set[int] = set()
        at: int | None = block_hash
        while at is not None and at in self.ever and at not in seen:
            seen.add(at)
            parent, tokens = self.ever[at]
            blocks.append(tokens)
            at = parent
        return [t for block in reversed(blocks) for t in block]


Stream = tuple[int, list[tuple[str, Any]]]


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    """A block size and steps whose tokens grow from 1 bit wide to 32 along the stream."""
    bs = draw(st.sampled_from([1, 3, 5, 7, 16]))
    width, next_hash, stored = 1, 1, list[int]()
    steps: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 25))):
        width = draw(st.integers(width, min(32, width + 9)))
        kind = draw(st.sampled_from(["store", "store", "store", "remove", "checkpoint", "lookup"]))
        tokens = st.integers(0, 2**width - 1)
        if kind == "store":
            n = draw(st.integers(1, 4))
            parent = draw(st.one_of(st.none(), st.sampled_from(stored))) if stored else None
            hashes = list(range(next_hash, next_hash + n))
            next_hash += n
            stored += hashes
            ids = draw(st.lists(tokens, min_size=n * bs, max_size=n * bs))
            steps.append(("store", (hashes, parent, ids)))
        elif kind == "remove" and stored:
            steps.append(("remove", draw(st.sampled_from(stored))))
        elif kind == "lookup" and stored:
            # A stored chain, then a block differing in one bit, which may be above the width.
            bit = draw(st.integers(0, 31))
            steps.append(("lookup", (draw(st.sampled_from(stored)), bit, draw(st.integers(0, 99)))))
        elif kind == "checkpoint":
            steps.append(("checkpoint", None))
    return bs, steps


@settings(max_examples=300, deadline=None)
@given(streams())
def test_packed_tokens_answer_as_plain_uint32_tokens(stream: Stream) -> None:
    bs, steps = stream
    table, reference, model = BlockTable(GPU0, 0.0), BlockTable(GPU0, 0.0), Model()
    reference.store_chain([SENTINEL], SENTINEL - 1, [2**32 - 1] * bs, bs, 0.0)
    for kind, arg in steps:
        if kind == "store":
            hashes, parent, ids = arg
            for t in (table, reference):
                t.store_chain(hashes, parent, ids, bs, 1.0)
            for i, h in enumerate(hashes):
                block = tuple(ids[i * bs : (i + 1) * bs])
                model.ever[h] = (parent if i == 0 else hashes[i - 1], block)
                model.cached.setdefault(h, [0, block])[0] += 1  # type: ignore[operator]
        elif kind == "remove":
            for t in (table, reference):
                t.remove([arg])
            if arg in model.cached:
                model.cached[arg][0] -= 1  # type: ignore[operator]
                if model.cached[arg][0] == 0:
                    del model.cached[arg]
        elif kind == "lookup":
            block_hash, bit, which = arg
            query = model.path(block_hash)
            _, near = model.ever[sorted(model.ever)[which % len(model.ever)]]
            query += [near[0] ^ (1 << bit), *near[1:]]
            for cut in (len(query) - bs, len(query)):
                q = TokenQuery(query[:cut])
                assert table.longest_prefix(q) == reference.longest_prefix(q), (query, cut)
        else:
            table = _checkpointed(table)
        entries = {e.hash: [e.count, e.token_ids] for e in table.entries()}
        assert entries == model.cached
        assert {h: list(e) for h, e in entries.items()} == {
            e.hash: [e.count, e.token_ids] for e in reference.entries() if e.hash != SENTINEL
        }
    # The same blocks at 32 bits (and the sentinel's slot) count as many bytes: 4 a token.
    assert table.token_bytes() <= reference.token_bytes()
    assert _checkpointed(table)._tokens == table._tokens


def test_a_restored_table_widens_what_it_restored() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain([1, 2], None, [3, 1, 2, 0, 7, 5], 3, 1.0)  # 3 bits wide
    table = _checkpointed(table)
    table.store_chain([3], 2, [70_000, 1, 2**31 + 5], 3, 2.0)  # 32 bits wide
    assert [e.token_ids for e in sorted(table.entries(), key=lambda e: e.hash)] == [
        (3, 1, 2),
        (0, 7, 5),
        (70_000, 1, 2**31 + 5),
    ]
    assert table.longest_prefix(TokenQuery([3, 1, 2, 0, 7, 5, 70_000, 1, 2**31 + 5])) == 3
    assert _checkpointed(table).longest_prefix(TokenQuery([3, 1, 2, 0, 7, 5, 70_000, 1])) == 2


def test_a_query_token_wider_than_the_table_matches_nothing() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain([1, 2], None, [3, 1, 2, 0, 7, 5], 3, 1.0)  # 3 bits wide
    assert table.longest_prefix(TokenQuery([3, 1, 2, 0, 7, 5])) == 2
    # 8 + 7 and 16 + 7 keep 7 in their low 3 bits: cut to the width, they would match.
    assert table.longest_prefix(TokenQuery([3, 1, 2, 0, 8 + 7, 5])) == 1
    assert table.longest_prefix(TokenQuery([16 + 3, 1, 2, 0, 7, 5])) == 0
    assert table.longest_prefix(TokenQuery([3, 1, 2, 0, 7, 5, 2**32 - 1, 0, 0])) == 2


def test_contents_count_four_bytes_a_token_whatever_their_width() -> None:
    narrow, wide = BlockTable(GPU0, 0.0), BlockTable(GPU0, 0.0)
    narrow.store_chain([1, 2], None, [0, 1] * 16, 16, 1.0)
    wide.store_chain([1, 2], None, [2**32 - 1, 1] * 16, 16, 1.0)
    assert narrow.token_bytes() == wide.token_bytes() >= 2 * 16 * 4


def test_blocks_of_zero_tokens_alone_match() -> None:
    table = BlockTable(GPU0, 0.0)
    table.store_chain([1, 2], None, [0, 0, 0, 0], 2, 1.0)  # no bit set anywhere
    assert table.longest_prefix(TokenQuery([0, 0, 0, 0, 0, 0])) == 2
    assert table.longest_prefix(TokenQuery([0, 0, 0, 1])) == 1


_records = st.integers(1, 4).flatmap(
    lambda bs: st.tuples(
        st.just(bs),
        st.lists(
            st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 9), min_size=bs, max_size=bs),
            min_size=1,
            max_size=6,
        ),
    )
)


@given(_records, st.lists(st.integers(0, 5), max_size=12))
def test_a_column_assigned_from_records_is_the_one_assigned_their_expansion(
    sized: tuple[int, list[list[int]]], picks: list[int]
) -> None:
    """What a format-3 checkpoint restores from its token blocks and their numbers: packed at
    the width of the blocks used alone (a delta's key may hold wider ones no slot uses)."""
    from array import array

    from kvscope.collector._checkpoint_columns import expand_records
    from kvscope.collector._token_column import TokenColumn

    block_size, blocks = sized
    records = array("I", [t for block in blocks for t in block]).tobytes()
    numbers = array("I", [k % len(blocks) for k in picks])
    expanded, direct = TokenColumn(), TokenColumn()
    expanded.assign(block_size, expand_records(numbers, records, 4 * block_size))
    direct.assign_records(block_size, numbers, records)
    assert (direct.width, direct.stride, direct.slots) == (
        expanded.width,
        expanded.stride,
        expanded.slots,
    )
    assert direct.to_uint32() == expanded.to_uint32()


def test_records_past_the_distinct_ones_are_refused() -> None:
    from array import array

    import pytest

    from kvscope.collector._token_column import TokenColumn

    with pytest.raises(ValueError):
        TokenColumn().assign_records(2, array("I", [0, 1]), array("I", [1, 2]).tobytes())
    with pytest.raises(ValueError):
        TokenColumn().assign_records(2, array("I", [0]), b"\x00" * 5)
