"""One reader serves every publisher of a fleet, and it keeps the last tail it read of an event
(its keys after token_ids or block_hashes: block_size, lora_id, medium, ...) to take the next
event's fields from where the bytes repeat (collector/_wire_scan.pxd's `TailMemo`). Publishers
taking turns with other tails (other block sizes, LoRA ids, media, groups, limits), with the
same tail bytes after other fields, or with hostile tails, must leave each map as decoding and
applying each batch alone leaves it, and be refused where that refuses."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector._replay import FusedApply
from kvscope.collector.errors import MalformedPayload
from kvscope.collector.limits import IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from tests.test_fleet_live_fused import TOPICS
from tests.test_fleet_live_fused import run as run_fleet
from tests.test_replay_fused import EPOCH, map_state
from tests.wire_fast_strategies import SETTINGS

MAX_BS = 32
"""The block size limit of most publishers' maps (one has a lower one)."""


class Raw(bytes):
    """A field's value as msgpack bytes, written as they are (a width msgspec would not pick,
    or a byte no encoder writes)."""


Pairs = list[tuple[str, Any]]


def event_bytes(pairs: Pairs) -> bytes:
    """An event map of `pairs` in their order (a key may repeat, as no dict lets it)."""
    assert len(pairs) < 16
    out = bytearray([0x80 | len(pairs)])
    for name, value in pairs:
        out += msgspec.msgpack.encode(name)
        out += value if isinstance(value, Raw) else msgspec.msgpack.encode(value)
    return bytes(out)


def batch_bytes(events: list[bytes], rank: int | None = 0) -> bytes:
    """`[ts, [events], rank]`, as vLLM's publisher encodes a batch."""
    head = bytes([0x93]) + msgspec.msgpack.encode(1.7e9) + bytes([0x90 | len(events)])
    return head + b"".join(events) + msgspec.msgpack.encode(rank)


def stored(
    hashes: list[int],
    parent: int | None,
    block_size: int = 16,
    before: Sequence[tuple[str, Any]] = (),
    tail: Callable[[Pairs], Pairs] = lambda pairs: pairs,
) -> bytes:
    """A BlockStored as vLLM 0.33 sends it (fields in its order); `before`: fields put before
    token_ids, `tail` rewrites the fields after it."""
    tokens = [(h * 31 + k) % 150_000 for h in hashes for k in range(block_size)]
    after: Pairs = [
        ("block_size", block_size),
        ("lora_id", None),
        ("medium", "GPU"),
        ("lora_name", None),
        ("extra_keys", [None] * len(hashes)),
        ("group_idx", 0),
        ("kv_cache_spec_kind", "full_attention"),
    ]
    head: Pairs = [("type", "BlockStored"), ("block_hashes", hashes)]
    head.append(("parent_block_hash", parent))
    return event_bytes([*head, *before, ("token_ids", tokens), *tail(after)])


def removed(hashes: list[int], medium: str = "GPU") -> bytes:
    return event_bytes([("type", "BlockRemoved"), ("block_hashes", hashes), ("medium", medium)])


def replaced(name: str, value: Any) -> Callable[[Pairs], Pairs]:
    return lambda pairs: [(k, value if k == name else v) for k, v in pairs]


def without(name: str) -> Callable[[Pairs], Pairs]:
    return lambda pairs: [(k, v) for k, v in pairs if k != name]


def plus(*extra: tuple[str, Any]) -> Callable[[Pairs], Pairs]:
    return lambda pairs: [*pairs, *extra]


def in_order(*rewrites: Callable[[Pairs], Pairs]) -> Callable[[Pairs], Pairs]:
    def rewrite(pairs: Pairs) -> Pairs:
        for step in rewrites:
            pairs = step(pairs)
        return pairs

    return rewrite


# Each publisher: how its stored events are written, its removals' medium, its map's limit.
Publisher = tuple[Callable[[list[int], int | None], bytes], str, int]
PUBLISHERS: dict[str, Publisher] = {
    "vllm": (lambda h, p: stored(h, p), "GPU", MAX_BS),
    "block size 8": (lambda h, p: stored(h, p, block_size=8), "GPU", MAX_BS),
    "block size as uint16": (
        lambda h, p: stored(h, p, tail=replaced("block_size", Raw(b"\xcd\x00\x10"))),
        "GPU",
        MAX_BS,
    ),
    "lora id": (lambda h, p: stored(h, p, tail=replaced("lora_id", 7)), "GPU", MAX_BS),
    "cpu": (lambda h, p: stored(h, p, tail=replaced("medium", "CPU")), "CPU", MAX_BS),
    "group 1": (lambda h, p: stored(h, p, tail=replaced("group_idx", 1)), "GPU", MAX_BS),
    "no extra keys": (lambda h, p: stored(h, p, tail=without("extra_keys")), "GPU", MAX_BS),
    "nil extra keys": (lambda h, p: stored(h, p, tail=replaced("extra_keys", None)), "GPU", MAX_BS),
    # vLLM's bytes, to a map whose limit is below their block size: refused.
    "limit 8": (lambda h, p: stored(h, p), "GPU", 8),
    # A LoRA name, an int extra key, a cache salt: each left to decode + apply.
    "lora name": (lambda h, p: stored(h, p, tail=replaced("lora_name", "adapter")), "GPU", MAX_BS),
    "extra key 1": (
        lambda h, p: stored(h, p, tail=replaced("extra_keys", [1] * len(h))),
        "GPU",
        MAX_BS,
    ),
    "salt after": (lambda h, p: stored(h, p, tail=plus(("cache_salt", "s"))), "GPU", MAX_BS),
    # vLLM's tail bytes exactly, after a field that changes what they mean: a salt, a duplicate
    # block_size, a lora_id that is no int (the tail has none), one more hash than extra keys.
    "salt before": (lambda h, p: stored(h, p, before=[("cache_salt", "s")]), "GPU", MAX_BS),
    "block size twice": (lambda h, p: stored(h, p, before=[("block_size", 16)]), "GPU", MAX_BS),
    "lora id before": (
        lambda h, p: stored(h, p, before=[("lora_id", 3)], tail=without("lora_id")),
        "GPU",
        MAX_BS,
    ),
    "no lora id": (lambda h, p: stored(h, p, tail=without("lora_id")), "GPU", MAX_BS),
    "bad lora id before": (
        lambda h, p: stored(h, p, before=[("lora_id", "x")], tail=without("lora_id")),
        "GPU",
        MAX_BS,
    ),
    "extra keys short": (
        lambda h, p: stored(h + [h[0] + 1], p, tail=replaced("extra_keys", [None] * len(h))),
        "GPU",
        MAX_BS,
    ),
    # The medium (the table) before token_ids, the same tail bytes after it.
    "gpu before": (
        lambda h, p: stored(h, p, before=[("medium", "GPU")], tail=without("medium")),
        "GPU",
        MAX_BS,
    ),
    "cpu before": (
        lambda h, p: stored(h, p, before=[("medium", "CPU")], tail=without("medium")),
        "CPU",
        MAX_BS,
    ),
    # vLLM's tail bytes and then more keys (the map is longer), or fewer of them.
    "one more key": (lambda h, p: stored(h, p, tail=plus(("locality", None))), "GPU", MAX_BS),
    "one key less": (lambda h, p: stored(h, p, tail=without("kv_cache_spec_kind")), "GPU", MAX_BS),
    # Bytes no sender writes in the tail: refused by decode, so by the reader.
    "never-used byte": (
        lambda h, p: stored(h, p, tail=replaced("lora_id", Raw(b"\xc1"))),
        "GPU",
        MAX_BS,
    ),
    "negative block size": (
        lambda h, p: stored(h, p, tail=replaced("block_size", Raw(b"\xff"))),
        "GPU",
        MAX_BS,
    ),
}
NAMES = sorted(PUBLISHERS)


def batch_of(name: str, seq: int, rnd: random.Random) -> bytes:
    """One of publisher `name`'s batches: stores of one block (now and then a few), chained,
    and removals of what it stored two batches before."""
    write, medium, _ = PUBLISHERS[name]
    events = []
    for k in range(rnd.randint(1, 3)):
        first = 10 * seq + 2 * k
        hashes = [first] if rnd.random() < 0.8 else [first, first + 1]
        events.append(write(hashes, first - 1 if first else None))
    if seq >= 2 and rnd.random() < 0.5:
        events.append(removed([10 * (seq - 2)], medium))
    return batch_bytes(events)


class Publishers:
    """One map per publisher, applied through a shared reader (decoded where it declines) and
    alone by decode + apply; what each refuses, in order."""

    def __init__(self) -> None:
        self.reader = FusedApply()
        self.fused: dict[str, PrefixMap] = {}
        self.today: dict[str, PrefixMap] = {}
        self.decoders: dict[str, BatchDecoder] = {}
        self.refusals: list[tuple[str, object, object]] = []

    def maps(self, name: str) -> tuple[PrefixMap, PrefixMap, BatchDecoder]:
        if name not in self.fused:
            limits = IngestLimits(max_block_size=PUBLISHERS[name][2])
            for maps in (self.fused, self.today):
                maps[name] = PrefixMap(StreamId(name, 0))
                maps[name].limits = limits
            self.decoders[name] = BatchDecoder(limits)
        return self.fused[name], self.today[name], self.decoders[name]

    def send(self, name: str, seq: int, payload: bytes) -> None:
        fused, today, decoder = self.maps(name)
        refused = self._fused(fused, decoder, seq, payload, PUBLISHERS[name][2])
        self.refusals.append((name, refused, self._decoded(today, decoder, seq, payload)))

    def _fused(
        self, prefix_map: PrefixMap, decoder: BatchDecoder, seq: int, payload: bytes, limit: int
    ) -> object:
        try:
            if self.reader.live(prefix_map, payload, seq, EPOCH, False, None, limit) < 0:
                prefix_map.apply(decoder.decode(payload, seq), EPOCH)
        except MalformedPayload as exc:
            return (exc.kind, exc.detail)
        return None

    @staticmethod
    def _decoded(prefix_map: PrefixMap, decoder: BatchDecoder, seq: int, payload: bytes) -> object:
        try:
            prefix_map.apply(decoder.decode(payload, seq), EPOCH)
        except MalformedPayload as exc:
            return (exc.kind, exc.detail)
        return None

    def assert_same(self) -> None:
        for name, fused, today in self.refusals:
            assert fused == today, name
        for name, prefix_map in self.fused.items():
            assert map_state(prefix_map) == map_state(self.today[name]), name


def play(order: list[str], seed: int = 0) -> Publishers:
    rnd = random.Random(seed)
    seqs = dict.fromkeys(order, 0)
    publishers = Publishers()
    for name in order:
        publishers.send(name, seqs[name], batch_of(name, seqs[name], rnd))
        seqs[name] += 1
    return publishers


@pytest.mark.parametrize("name", [n for n in NAMES if n != "vllm"])
def test_a_publisher_taking_turns_with_vllms_ends_as_decoded(name: str) -> None:
    """Each odd publisher against vLLM's, turn about: whichever tail the reader kept last."""
    publishers = play(["vllm", name] * 12)
    publishers.assert_same()


def test_every_publisher_taking_turns_ends_as_decoded() -> None:
    publishers = play(NAMES * 6)
    publishers.assert_same()


@SETTINGS
@given(st.lists(st.sampled_from(NAMES), min_size=1, max_size=40), st.integers(0, 2**32))
def test_publishers_in_any_order_end_as_decoded(order: list[str], seed: int) -> None:
    play(order, seed).assert_same()


def test_a_repeated_tail_is_applied_from_its_bytes() -> None:
    """The memo serves vLLM's batches: each one after the first is still taken by the reader
    (none is left to decode + apply), among other publishers' turns."""
    publishers = play(["vllm", "block size 8", "cpu", "lora id", "group 1"] * 10)
    publishers.assert_same()
    assert publishers.reader.taken == 50


def test_the_same_tail_after_another_medium_is_another_table() -> None:
    """A tail kept after one medium, then the same bytes after another: the table is the
    event's medium's, not the one the kept tail's event went to."""
    publishers = play(["gpu before", "cpu before"] * 4)
    publishers.assert_same()
    assert publishers.reader.taken == 8
    assert [key.medium for key in publishers.fused["cpu before"].tables] == ["CPU"]


@pytest.mark.parametrize(
    ("first", "name"),
    [
        ("vllm", "limit 8"),
        ("no lora id", "bad lora id before"),
        ("vllm", "extra keys short"),
        ("vllm", "never-used byte"),
        ("vllm", "negative block size"),
    ],
)
def test_a_hostile_tail_after_a_good_one_is_refused_as_decoded(first: str, name: str) -> None:
    """A good tail read and kept first, then one whose bytes, or the same bytes after another
    field or under another limit, mean a refusal: refused each time, as decode + apply refuses
    it."""
    publishers = play([first, name] * 4)
    publishers.assert_same()
    refused = [fused for sender, fused, _ in publishers.refusals if sender == name]
    assert all(refusal is not None for refusal in refused)
    assert publishers.reader.taken == 4  # the good publisher's alone


@pytest.mark.parametrize(
    "name", ["salt before", "salt after", "lora name", "extra key 1", "block size twice"]
)
def test_a_tail_after_vllms_that_is_not_the_readers_is_left_to_decode(name: str) -> None:
    """vLLM's tail kept first, then one the reader must not take (a salt, a LoRA name, an int
    extra key, a duplicate key), some with vLLM's tail bytes exactly: each of its batches left
    to decode + apply, whichever came before."""
    publishers = play(["vllm", name] * 4)
    publishers.assert_same()
    assert publishers.reader.taken == 4  # vLLM's alone


def test_a_fleet_of_publishers_with_other_tails_ends_as_decoded() -> None:
    """The same through a fleet's router, whose reader reads each message before its stream is
    known: two topics, each rank of them a publisher with a tail of its own."""
    rnd = random.Random(5)
    publishers = {
        (TOPICS[0], 0): "vllm",
        (TOPICS[1], 0): "salt before",
        (TOPICS[0], 1): "no lora id",
        (TOPICS[1], 1): "bad lora id before",
        (TOPICS[0], 2): "block size 8",
        (TOPICS[1], 2): "extra keys short",
    }
    steps = []
    for seq in range(8):
        for (topic, rank), name in publishers.items():
            payload = batch_of(name, seq, rnd)[:-1] + msgspec.msgpack.encode(rank)
            steps.append((topic, payload, "next", 8, 3))
    # The default limits, the router's: each stream applies the batch as the router read it.
    fused, today = run_fleet(steps, IngestLimits(), True), run_fleet(steps, IngestLimits(), False)
    assert fused[:3] == today[:3]
    assert fused[3] > 0
