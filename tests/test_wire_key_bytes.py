"""The table key of an event whose medium and group_idx bytes repeat the last key's
(`_LastKey.of` in collector/_wire_fast.pxd: no read, no call) against the key read from its
fields (`_LastKey.key_of`), on sequences of events at every msgpack width, with values the
rules refuse, and cut anywhere."""

from __future__ import annotations

import random
import struct

from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector import wire_rules as rules
from kvscope.collector._wire_fast import _keys_both_ways
from tests.wire_fast_strategies import SETTINGS
from tests.wire_fast_support import event_map, fixstr, ints, pack

RND = random.Random(0)
ABSENT = None


def str8(data: bytes) -> bytes:
    return b"\xd9" + bytes([len(data)]) + data


def str16(data: bytes) -> bytes:
    return b"\xda" + struct.pack(">H", len(data)) + data


# Medium and group_idx values as they come on the wire (ABSENT: no such key): the usual ones at
# every width, the longest the fast path keeps and the first it does not, and values the rules
# refuse (a too long medium, one not UTF-8, bytes, a group out of range, a float).
MEDIUMS: list[bytes | None] = [
    ABSENT,
    b"\xc0",
    fixstr(b"GPU"),
    str8(b"GPU"),
    str16(b"GPU"),
    fixstr(b"CPU"),
    fixstr(b"GPV"),
    fixstr(b""),
    fixstr(b"x" * 31),
    str8(b"x" * 31),
    str8(b"x" * 32),
    str8(b"x" * 33),
    fixstr(b"\xff\xfe"),
    b"\xc4\x03GPU",
    b"\x05",
]
GROUPS: list[bytes | None] = [
    ABSENT,
    b"\xc0",
    *ints(0),
    *ints(1),
    *ints(rules.MAX_GROUP),
    *ints(rules.MAX_GROUP + 1),
    *ints(-1),
    b"\xcb" + struct.pack(">d", 0.0),
    fixstr(b"0"),
]


def event(medium: bytes | None, group: bytes | None, removed: bool, rnd: random.Random) -> bytes:
    items = [
        (b"type", pack("BlockRemoved" if removed else "BlockStored", rnd)),
        (b"block_hashes", pack([rnd.randrange(2**64)], rnd)),
        (b"medium", medium),
        (b"group_idx", group),
    ]
    return event_map(items, rnd)


def batch(events: list[bytes], rnd: random.Random) -> bytes:
    """[ts, events, rank nil], the events already encoded."""
    n = len(events)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
    return b"\x93" + pack(1.7e9, rnd) + head + b"".join(events) + b"\xc0"


def assert_same_keys(payloads: list[bytes]) -> list[bool]:
    """Every event's key the same both ways; whether `of` matched the bytes, per event."""
    seen = _keys_both_ways(payloads)
    for fast, general, _ in seen:
        assert (fast is None) == (general is None)
        assert fast == general
    return [matched for _, _, matched in seen]


@st.composite
def payloads(draw: st.DrawFn) -> list[bytes]:
    rnd = random.Random(draw(st.integers(0, 2**32)))
    # Few values a stream, so that they repeat, as a replica's do.
    mediums = draw(st.lists(st.sampled_from(MEDIUMS), min_size=1, max_size=3))
    groups = draw(st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        events = [
            event(draw(st.sampled_from(mediums)), draw(st.sampled_from(groups)), removed, rnd)
            for removed in draw(st.lists(st.booleans(), max_size=6))
        ]
        out.append(batch(events, rnd))
    return out


@SETTINGS
@given(payloads())
def test_a_key_matched_by_its_bytes_is_the_key_its_fields_name(stream: list[bytes]) -> None:
    assert_same_keys(stream)


@SETTINGS
@given(payloads(), st.data())
def test_the_same_holds_for_payloads_cut_anywhere(stream: list[bytes], data: st.DataObject) -> None:
    cut = [p[: data.draw(st.integers(0, len(p)))] for p in stream]
    assert_same_keys(cut)


def test_every_pair_of_values_one_after_the_other() -> None:
    # Each (medium, group) after each other: every way the bytes can differ or match.
    pairs = [(m, g) for m in MEDIUMS for g in GROUPS]
    events = [event(m, g, False, RND) for m, g in pairs for _ in range(2)]
    matched = assert_same_keys([batch(events[i : i + 8], RND) for i in range(0, len(events), 8)])
    assert any(matched) and not all(matched)  # both ways were taken
    events = [event(m, g, True, RND) for m2, g2 in pairs[::7] for m, g in ((m2, g2), pairs[0])]
    assert_same_keys([batch(events, RND)])


def test_bytes_that_repeat_are_matched_and_other_widths_are_read() -> None:
    gpu0 = [event(fixstr(b"GPU"), b"\x00", False, RND) for _ in range(3)]
    wide = event(str8(b"GPU"), b"\xcc\x00", False, RND)
    nil = event(b"\xc0", b"\xc0", False, RND)
    absent = event(ABSENT, ABSENT, False, RND)
    matched = assert_same_keys([batch([*gpu0, wide, wide, nil, absent, absent], RND)])
    assert matched == [False, True, True, False, True, False, False, True]
    # A key held for the longest bytes kept, not for longer ones (read each time).
    long31 = event(fixstr(b"x" * 31), ABSENT, True, RND)
    long32 = event(str8(b"x" * 32), ABSENT, True, RND)
    assert assert_same_keys([batch([long31, long31, long32, long32], RND)]) == [
        False,
        True,
        False,
        False,
    ]


def test_refused_bytes_are_never_matched() -> None:
    good = event(fixstr(b"GPU"), b"\x00", False, RND)
    for medium, group in [(fixstr(b"\xff\xfe"), b"\x00"), (fixstr(b"GPU"), b"\xff")]:
        bad = event(medium, group, False, RND)
        seen = _keys_both_ways([batch([good, bad, bad, good], RND)])
        assert [(fast is None, matched) for fast, _, matched in seen] == [
            (False, False),
            (True, False),
            (True, False),
            (False, True),
        ]


def test_bytes_at_the_payloads_end_are_matched_too() -> None:
    # The group byte last in the payload (no rank): fewer than a word's bytes are left after it.
    def last_group(group: bytes) -> bytes:
        items = [(b"type", fixstr(b"BlockRemoved")), (b"block_hashes", b"\x91\x05")]
        items += [(b"medium", fixstr(b"GPU")), (b"group_idx", group)]
        return bytes([0x80 | len(items)]) + b"".join(fixstr(k) + v for k, v in items)

    for second in (b"\x01", b"\x02"):
        payload = b"\x92" + pack(1.7e9, RND) + b"\x92" + last_group(b"\x01") + last_group(second)
        assert payload.endswith(second)
        assert assert_same_keys([payload]) == [False, second == b"\x01"]
