"""A BlockStored's parent hash and block size at every msgpack width, and cut anywhere: the
checks of collector/_wire_checks.pyx read a uint64 parent and a fixint block size themselves
(as senders write them), any other width through the general reads; the compiled decoder must
agree with the slow path either way, and the fused replay with decode + apply."""

from __future__ import annotations

import random
import struct

import pytest

from kvscope.collector._wire_fast import decode_map_batch
from tests.test_replay_fused import LIMITS, assert_same_replay
from tests.wire_fast_support import MAX_BS, check, event_map, ints, pack

RND = random.Random(0)
PARENTS = [
    None,
    b"\xc0",
    *ints(7),
    *ints(2**63 - 1),
    *ints(2**64 - 1),
    *ints(-1),
    b"\xcb" + bytes(8),
]
SIZES = [None, *ints(4), *ints(0), *ints(MAX_BS), *ints(MAX_BS + 1), *ints(-4), b"\xc0"]


def stored(parent: bytes | None, size: bytes | None, hashes: list[int]) -> bytes:
    tokens = [RND.randrange(2**17) for _ in range(4 * len(hashes))]
    items = [
        (b"type", pack("BlockStored", RND)),
        (b"block_hashes", pack(hashes, RND)),
        (b"token_ids", pack(tokens, RND)),
        (b"parent_block_hash", parent),
        (b"block_size", size),
    ]
    return event_map(items, RND)


def batch(events: list[bytes]) -> bytes:
    return b"\x93" + pack(1.7e9, RND) + bytes([0x90 | len(events)]) + b"".join(events) + b"\xc0"


PAYLOADS = [
    batch([stored(parent, size, [11, 12]), stored(b"\xcf" + struct.pack(">Q", 12), size, [13])])
    for parent in PARENTS
    for size in SIZES
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_each_width_decodes_as_the_slow_path_does(payload: bytes) -> None:
    check(payload)
    for end in range(len(payload)):
        assert decode_map_batch(payload[:end], 0, MAX_BS) is None


def test_the_usual_widths_are_taken_and_the_others_too() -> None:
    usual = batch([stored(b"\xcf" + struct.pack(">Q", 2**64 - 1), b"\x04", [1])])
    assert check(usual) is not None
    wide = batch([stored(b"\xcd\x01\x00", b"\xcc\x04", [1])])
    assert check(wide) is not None
    bad = [batch([stored(b"\xff", b"\x04", [1])]), batch([stored(None, b"\xff", [1])])]
    assert [check(p) for p in bad] == [None, None]


def test_the_fused_replay_applies_each_width_as_decode_and_apply() -> None:
    for payload in PAYLOADS:  # one at a time: a refused one stops a replay
        for limits in LIMITS[:2]:
            assert_same_replay([(1, payload)], limits)
