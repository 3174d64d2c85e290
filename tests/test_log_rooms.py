"""A chunk's columns are written into rooms made when its walk begins (storage/_log_rooms.pxd):
its payload bytes times each column's share of them in the chunks packed last, within the most
the split can put there. A column that fits its room is never copied to grow; one that does
not still comes out whole; and the rooms are learned from the chunks packed."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.storage._log_columns import (
    pack_runs,
    room_shares,
    room_sizes_of,
    rooms_outgrown,
    split,
)
from kvscope.storage.log_columns import NO_GRANULES
from tests.test_log_columns import ANY_MSGPACK
from tests.test_log_pack_scratch import chunk_payloads

IDS = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=70)
"""Token ids of up to 4 bytes: a run the split sends to the token column."""
WORDS = st.lists(st.integers(2**32, 2**64 - 1) | st.floats(allow_nan=False), max_size=40)
"""8-byte ints and floats: the references, literals and floats."""
PAYLOAD = (
    ANY_MSGPACK.map(msgspec.msgpack.encode)
    | IDS.map(msgspec.msgpack.encode)
    | WORDS.map(msgspec.msgpack.encode)
    | st.binary(max_size=60)
)


def _within_bounds(payloads: list[bytes]) -> None:
    for granules in (False, True):
        columns, _ = split(payloads, granules=NO_GRANULES if granules else None)
        bounds = room_sizes_of(payloads, granules)
        assert all(len(c) <= bound for c, bound in zip(columns, bounds, strict=True))
    total = sum(map(len, payloads))
    assert sum(room_sizes_of(payloads, True)) <= 5 * total + 10 * len(payloads) + 27


@settings(max_examples=300, deadline=None)
@given(st.lists(PAYLOAD, max_size=12))
def test_no_column_holds_more_than_its_bound(payloads: list[bytes]) -> None:
    _within_bounds(payloads)
    _within_bounds(payloads * 3)  # hashes seen before: references back


def test_columns_filled_to_their_bounds_fit_them() -> None:
    """Payloads made of what fills each column most: 8-byte ints never seen before, floats,
    token ids alone, and payloads kept verbatim."""
    hashes = [msgspec.msgpack.encode(2**63 + k) for k in range(5_000)]
    floats = [msgspec.msgpack.encode(k + 0.5) for k in range(5_000)]
    ids = [msgspec.msgpack.encode(list(range(k, k + 16 * 40))) for k in range(100)]
    verbatim = [b"\xc1" * 300, b"\xcf\x00", b""]
    for payloads in (hashes, floats, ids, verbatim, hashes + floats + ids + verbatim):
        _within_bounds(payloads)


def test_rooms_are_learned_from_the_chunks_packed() -> None:
    """Chunks like those packed last fit their rooms; a chunk unlike them (all verbatim) still
    comes out whole, and the next rooms are learned from it."""
    runs = chunk_payloads(random.Random(5))
    pack_runs(runs, [NO_GRANULES] * len(runs), [True] * len(runs))
    before = rooms_outgrown()
    again = pack_runs(runs, [NO_GRANULES] * len(runs), [True] * len(runs))
    assert rooms_outgrown() == before
    odd = [bytes([0xC1]) + bytes(range(200)) for _ in range(50)]
    n = len(runs) + 1
    (parts, kept), *_ = pack_runs([odd, *runs], [NO_GRANULES] * n, [True] * n)
    assert kept == 50 and parts[1] == b"".join(odd)
    assert rooms_outgrown() > before  # its skeleton outgrew the room learned from blocks
    assert room_shares()[1] > 1024  # the whole of its payloads
    assert pack_runs(runs, [NO_GRANULES] * len(runs), [True] * len(runs)) == again
