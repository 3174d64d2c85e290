"""Format 5 numbers the token blocks a caller knows (a stream's log dictionary's) instead of
holding them, and gives the map back exactly only with those very blocks."""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._checkpoint_columns import previous_siblings
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import (
    KnownBlocks,
    SnapshotError,
    blocks_named,
    decode_map,
    encode_map,
    known_blocks,
    recode,
    snapshot_version,
)
from kvscope.collector.types import Batch, KVEvent
from tests.test_prefix_map import events, stored
from tests.test_snapshot import STREAM, columns_of, state_of

NAME = b"d" * 16


def _blocks_of(prefix_map: PrefixMap, every: int) -> bytes:
    """Every `every`-th token block the map holds, as uint32 records."""
    found = []
    for table in prefix_map.tables.values():
        for entry in table.entries():
            if entry.token_ids is not None and len(entry.token_ids) == table.block_size:
                found.append(array("I", entry.token_ids).tobytes())
    return b"".join(found[::every])


def _known(prefix_map: PrefixMap, every: int, extra: bytes = b"") -> KnownBlocks:
    block_size = max(t.block_size for t in prefix_map.tables.values())
    return known_blocks(NAME, extra + _blocks_of(prefix_map, every), 4 * block_size)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(events, max_size=40),
    st.lists(events, max_size=20),
    st.integers(1, 3),
    st.lists(st.integers(0, 2**32 - 1), max_size=24),
)
def test_a_map_numbering_known_blocks_comes_back_byte_for_byte(
    before: list[KVEvent], after: list[KVEvent], every: int, others: list[int]
) -> None:
    original = PrefixMap(STREAM)
    original.apply(Batch(0, 10.0, 0, before))
    original.apply(Batch(1, 11.0, 0, after))
    block_size = max((t.block_size for t in original.tables.values()), default=0)
    if not block_size:
        return  # no token blocks to know
    extra = array("I", others[: len(others) - len(others) % block_size]).tobytes()
    known = _known(original, every, extra)
    data = encode_map(original, known=known)
    assert snapshot_version(data) == 5
    restored = decode_map(data, STREAM, lambda name: known)
    assert state_of(restored) == state_of(original)
    for key, table in original.tables.items():
        assert columns_of(restored.tables[key]) == columns_of(table)
    if blocks_named(data) is not None:
        assert blocks_named(data) == NAME
        with pytest.raises(SnapshotError):
            decode_map(data, STREAM)  # the blocks not given
        # Recoded with its blocks, it holds them itself.
        whole = recode(data, 5, lambda name: known)
        assert blocks_named(whole) is None
        assert state_of(decode_map(whole, STREAM)) == state_of(original)


def _many_blocks() -> PrefixMap:
    """Chains of blocks of random token ids (as text's are, to zstd)."""
    rng = random.Random(0)
    prefix_map = PrefixMap(STREAM)
    for root in range(50):
        hashes = list(range(root * 1000 + 1, root * 1000 + 41))
        event = stored(hashes, None)
        tokens = [rng.randrange(150_000) for _ in event.token_ids]
        prefix_map.apply(
            Batch(root, 1.0 + root, 0, [msgspec.structs.replace(event, token_ids=tokens)])
        )
    return prefix_map


def test_known_blocks_are_named_and_not_held() -> None:
    prefix_map = _many_blocks()
    alone = encode_map(prefix_map)
    known = _known(prefix_map, 1)
    named = encode_map(prefix_map, known=known)
    assert blocks_named(alone) is None and blocks_named(named) == NAME
    assert len(named) < len(alone)
    assert state_of(decode_map(named, STREAM, lambda name: known)) == state_of(prefix_map)


def test_other_known_blocks_are_refused() -> None:
    prefix_map = _many_blocks()
    known = _known(prefix_map, 1)
    data = encode_map(prefix_map, known=known)
    fewer = _known(prefix_map, 2)
    with pytest.raises(SnapshotError):
        decode_map(data, STREAM, lambda name: fewer)


def test_known_blocks_of_another_block_size_are_left_alone() -> None:
    prefix_map = _many_blocks()
    known = known_blocks(NAME, bytes(range(28)), 28)  # of no table's block size
    data = encode_map(prefix_map, known=known)
    assert blocks_named(data) is None
    assert state_of(decode_map(data, STREAM)) == state_of(prefix_map)


def test_previous_siblings_follow_from_the_next() -> None:
    nxt = array("i", [2, -1, 3, -1, -1])
    assert previous_siblings(nxt) == array("i", [-1, -1, 0, 2, -1])
    with pytest.raises(ValueError):
        previous_siblings(array("i", [7]))


def test_format_5_leaves_out_the_previous_siblings() -> None:
    state = msgspec.msgpack.decode(encode_map(_many_blocks(), compressed=False))
    table = state["tables"][0]
    assert table["implied"] == ["prev_sibling"]
    assert table["columns"][BlockTable._COLUMNS.index("_prev_sibling")] == b""
