"""Structurally hostile batches: well-formed msgpack that breaks the shape of a `KVEventBatch`.

Every builder takes the run's `random.Random` and real events of the capture (generically
decoded maps) and returns the payload. Nearly all of them are refused by the collector's rules
(collector/wire_rules.py); a few are valid batches on purpose (unknown event types and fields,
removals of unknown hashes), which must be skipped or applied without harm. None is a valid
`AllBlocksCleared`: a hostile clear the collector accepts would be the publisher's word.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from kvscope.collector.errors import MalformedPayload
from kvscope.collector.wire import ARRAY_FIELDS, BatchDecoder
from kvscope.fuzz.msgpack_raw import Ext, Pairs, Raw, array_header, float32, pack, str_header

Event = dict[str, Any]
Builder = Callable[[random.Random, list[Event]], bytes]

HUGE_INTS = (2**63, 2**64 - 1, -1, -(2**63), 2**63 - 1, 2**32, -(2**31))
HOSTILE_VALUES: tuple[object, ...] = (
    None,
    True,
    False,
    0,
    -1,
    *HUGE_INTS,
    1.5,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "GPU" * 40,
    b"",
    b"\xff" * 100,
    [],
    [None],
    [[]],
    [[[[1]]]],
    {},
    {"a": 1},
    {1: 2},
    [2**64 - 1] * 3,
    [-1],
    [1.5],
    ["a"],
    [True],
    [b"x" * 65],
    Raw(b"\xa2\xff\xfe"),
    Raw(float32(math.nan)),
    Ext(1, b"abcd"),
    Ext(-1, b"\x00" * 12),
)
# The fields kvscope reads, as the decoder names them, and vLLM 0.33's newer ones it ignores.
STORED_FIELDS = (
    "type",
    *ARRAY_FIELDS["BlockStored"],
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
REMOVED_FIELDS = ("type", *ARRAY_FIELDS["BlockRemoved"])
DEEP = (2_000, 20_000, 200_000)


def _batch(events: object, ts: object = 1.0e9, rank: object = 0) -> bytes:
    return pack([ts, events, rank])


def _stored(rng: random.Random, real: list[Event]) -> Event:
    stored = [e for e in real if e.get("type") == "BlockStored"]
    if stored:
        return dict(rng.choice(stored))
    size = 16
    return {
        "type": "BlockStored",
        "block_hashes": [rng.getrandbits(64)],
        "parent_block_hash": None,
        "token_ids": [1] * size,
        "block_size": size,
        "medium": "GPU",
    }


def _removed(rng: random.Random, real: list[Event]) -> Event:
    removed = [e for e in real if e.get("type") == "BlockRemoved"]
    return dict(rng.choice(removed)) if removed else {"type": "BlockRemoved", "block_hashes": [1]}


def _with_good(rng: random.Random, real: list[Event], bad: object) -> bytes:
    """`bad` among good events (it must refuse the whole batch, the good ones too), sometimes
    with an `AllBlocksCleared`, which a refused batch must not apply; when `bad` turns out to be
    acceptable (a hostile value can be a valid one), the clear is left out."""
    events: list[object] = [_stored(rng, real) for _ in range(rng.randint(0, 3))]
    events.insert(rng.randint(0, len(events)), bad)
    if rng.random() < 0.3:
        cleared = list(events)
        cleared.insert(rng.randint(0, len(events)), {"type": "AllBlocksCleared"})
        payload = _batch(cleared)
        if not _decodes(payload):
            return payload
    return _batch(events)


def _decodes(payload: bytes) -> bool:
    try:
        BatchDecoder().decode(payload, 0)
    except MalformedPayload:
        return False
    return True


def wrong_type(rng: random.Random, real: list[Event]) -> bytes:
    """One field of a BlockStored or BlockRemoved set to a hostile value."""
    fields: tuple[str, ...]
    if rng.random() < 0.7:
        event, fields = _stored(rng, real), STORED_FIELDS
    else:
        event, fields = _removed(rng, real), REMOVED_FIELDS
    event[rng.choice(fields)] = rng.choice(HOSTILE_VALUES)
    return _with_good(rng, real, event)


def nil_field(rng: random.Random, real: list[Event]) -> bytes:
    event = _stored(rng, real)
    for field in rng.sample(("block_hashes", "token_ids", "block_size"), rng.randint(1, 3)):
        event[field] = None
    return _with_good(rng, real, event)


def huge_int(rng: random.Random, real: list[Event]) -> bytes:
    event = _stored(rng, real)
    field = rng.choice(
        (
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "group_idx",
            "lora_id",
            "rank",
        )
    )
    value = rng.choice(HUGE_INTS)
    if field == "rank":
        return _batch([event], rank=value)
    if field in ("block_hashes", "token_ids"):
        items = list(event.get(field) or [0])
        items[rng.randrange(len(items))] = value
        event[field] = items
    else:
        event[field] = value
    return _with_good(rng, real, event)


def bad_ts(rng: random.Random, real: list[Event]) -> bytes:
    ts = rng.choice(
        (
            math.nan,
            math.inf,
            -math.inf,
            Raw(float32(math.nan)),
            Raw(float32(math.inf)),
            None,
            "1.0",
            b"\x00" * 8,
            [1.0],
            2**64 - 1,
        )
    )
    return _batch([_stored(rng, real)], ts=ts)


def huge_block_size(rng: random.Random, real: list[Event]) -> bytes:
    event = _stored(rng, real)
    event["block_size"] = rng.choice((16_385, 65_536, 2**31, 2**32 + 16, 2**63))
    event["token_ids"] = rng.choice(([], event.get("token_ids", [])))
    return _with_good(rng, real, event)


def many_tables(rng: random.Random, real: list[Event]) -> bytes:
    """Thousands of groups or media in one batch: far more tables than a stream may have."""
    base, n = _stored(rng, real), rng.randint(65, 5_000)
    field = rng.choice(("group_idx", "medium"))
    events = [dict(base, **{field: i if field == "group_idx" else f"M{i}"}) for i in range(n)]
    return _batch(events)


def deep_nesting(rng: random.Random, real: list[Event]) -> bytes:
    depth = rng.choice(DEEP)
    nest = Raw(b"\x91" * depth + b"\xc0")
    where = rng.choice(("events", "event", "extra_keys", "ts", "hashes"))
    if where == "events":
        return _batch(nest)
    if where == "ts":
        return _batch([], ts=nest)
    event = _stored(rng, real)
    if where == "extra_keys":
        event["extra_keys"] = [nest] * len(event.get("block_hashes") or [0])
    elif where == "hashes":
        event["block_hashes"] = nest
    else:
        return _with_good(rng, real, nest)
    return _with_good(rng, real, event)


def huge_hashes(rng: random.Random, real: list[Event]) -> bytes:
    """10^4 to 10^6 hashes in one event: refused by a last bad one or by the token count, or a
    removal of unknown hashes (valid: each is counted, nothing changes)."""
    n = rng.choices((10_000, 100_000, 1_000_000), (6, 3, 1))[0]
    hashes = [rng.getrandbits(64) for _ in range(1000)] * (n // 1000)
    how = rng.choice(("bad_last", "tokens", "removed"))
    if how == "removed":
        return _batch([{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}])
    event = _stored(rng, real)
    event["block_hashes"] = [*hashes, "x"] if how == "bad_last" else hashes
    return _with_good(rng, real, event)


def ragged_tokens(rng: random.Random, real: list[Event]) -> bytes:
    """token_ids whose length is no multiple of block_size (or too few for the hashes)."""
    event = _stored(rng, real)
    size = event.get("block_size") or 16
    n = len(event.get("block_hashes") or [1]) * size + rng.choice((-1, 1, size // 2 or 1))
    event["token_ids"] = [rng.randrange(1 << 16) for _ in range(max(n, 1))]
    return _with_good(rng, real, event)


def bad_shape(rng: random.Random, real: list[Event]) -> bytes:
    """The outer batch or an event of the wrong shape."""
    choice = rng.randrange(12)
    good = _stored(rng, real)
    shapes: list[Callable[[], bytes]] = [
        lambda: pack({"ts": 1.0, "events": [good]}),
        lambda: pack(rng.choice((0, "batch", None, b"", 1.5, True))),
        lambda: pack([1.0]),
        lambda: pack([1.0, {"type": "BlockStored"}, 0]),
        lambda: pack([]),
        lambda: _with_good(rng, real, rng.choice((0, "BlockStored", None, [], [7], b"x", 1.5))),
        lambda: _with_good(rng, real, {k: v for k, v in good.items() if k != "type"}),
        lambda: _with_good(rng, real, {1: "BlockStored", b"type": "BlockStored"}),
        lambda: _with_good(rng, real, Pairs((*good.items(), ("block_hashes", "dup")))),
        lambda: _with_good(rng, real, dict(good, type=Raw(str_header(11) + b"BlockStor\xff\xfe"))),
        lambda: _batch(Raw(array_header(2**32 - 1) + pack(good))),
        lambda: _with_good(rng, real, ["BlockStored", *rng.sample(HOSTILE_VALUES, 6)]),
    ]
    return shapes[choice]()


def harmless(rng: random.Random, real: list[Event]) -> bytes:
    """Valid batches a later vLLM could send: unknown event types and fields, array-layout
    removals of unknown hashes, trailing batch items; the map must not change."""
    tag = rng.choice(("BlockInactive", "Heartbeat", "blockstored", "AllBlocksCleared "))
    unknown = {"type": tag, "block_hashes": [1, 2], "publisher_id": "x" * 50}
    events: list[object] = [unknown] * rng.randint(1, 50)
    if rng.random() < 0.5:
        events.append(["BlockRemoved", [rng.getrandbits(64)], "GPU", 0, "extra", None])
    return pack([1.0e9, events, 0, "trailing", {"x": 1}])


BUILDERS: dict[str, Builder] = {
    "wrong_type": wrong_type,
    "nil_field": nil_field,
    "huge_int": huge_int,
    "bad_ts": bad_ts,
    "huge_block_size": huge_block_size,
    "many_tables": many_tables,
    "deep_nesting": deep_nesting,
    "huge_hashes": huge_hashes,
    "ragged_tokens": ragged_tokens,
    "bad_shape": bad_shape,
    "harmless": harmless,
}
WEIGHTS = {"many_tables": 2, "deep_nesting": 2, "huge_hashes": 1, "harmless": 4}
"""Relative frequency of each builder (others: 8). The big ones are rarer: they cost seconds."""
