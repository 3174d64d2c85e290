"""A reset follower's loop (storage/_reset_orphans.pyx `follow_batches`) follows the orphans
of a batch the fused read takes straight from that read, building no events: on random
streams of logged batches its map and orphans are those of each batch decoded, applied and
followed by the Python step (tests/test_reset_orphans_index.py's reference), and a batch the
read declines (the usual way's) is followed from its decoded events as before."""

from __future__ import annotations

import importlib
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from kvscope.storage._reset_orphans import follow_batches
from kvscope.storage.log_chunks import LoggedBatch
from kvscope.storage.reset_orphans import Orphans
from tests.test_reset_orphans_index import PythonOrphans, _root

STREAM = StreamId("r", 0)
EPOCH = 3
# Few hashes (stores repeat, parents come and go), some with the high bits set.
HASH = st.integers(0, 20) | st.sampled_from([2**64 - 1, 2**63, 1 << 40])
MEDIUM = st.sampled_from(["GPU", "CPU"])


@st.composite
def _stored(draw: st.DrawFn) -> dict[str, Any]:
    hashes = draw(st.lists(HASH, min_size=0, max_size=5))
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": hashes, "block_size": 2}
    if draw(st.booleans()):
        event["token_ids"] = [draw(st.integers(0, 9)) for _ in range(2 * len(hashes))]
    event["parent_block_hash"] = draw(st.none() | HASH)
    if draw(st.booleans()):
        event["medium"] = draw(MEDIUM)
    return event


@st.composite
def _removed(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockRemoved",
        "block_hashes": draw(st.lists(HASH, min_size=1, max_size=4)),
    }
    if draw(st.booleans()):
        event["medium"] = draw(MEDIUM)
    return event


@st.composite
def _event(draw: st.DrawFn) -> Any:
    pick = draw(st.integers(0, 40))
    if pick < 20:
        return draw(_stored())
    if pick < 38:
        return draw(_removed())
    if pick < 39:
        return {"type": "AllBlocksCleared"}
    # One the fused read declines: its batch is decoded and applied the usual way.
    return {"type": "BlockStored", "block_hashes": [draw(HASH)], "lora_name": "adapter"}


_payloads = st.lists(
    st.lists(_event(), max_size=8).map(lambda events: msgspec.msgpack.encode([1.7e9, events])),
    max_size=30,
)


class _Follower:
    """What `follow_batches` reads and writes of a `ResetFollower`."""

    def __init__(self, view: PrefixMap, orphans: Orphans) -> None:
        self.view, self.epoch, self.orphans = view, EPOCH, orphans
        self._decoder = BatchDecoder()
        self.states: list[Any] = []
        self.last_ts: float | None = None
        self.after: int | None = None
        self.replayed = 0

    def _next_instant(self) -> float:
        return math.inf

    def _state(self) -> Any:
        raise AssertionError("no offset is passed")


def _start(first: list[bytes]) -> PrefixMap:
    view = PrefixMap(STREAM)
    decode = BatchDecoder().decode
    for seq, payload in enumerate(first):
        view.apply(decode(payload, seq), EPOCH)
    return view


def _followed(first: list[bytes], rest: list[bytes]) -> tuple[Orphans, Orphans, Any, Any]:
    mine, reference = Orphans(_root), PythonOrphans(_root)
    view, reference_view = _start(first), _start(first)
    mine.start(view, 100.0)
    reference.start(reference_view, 100.0)
    batches = [
        LoggedBatch(seq, float(seq), float(seq), payload)
        for seq, payload in enumerate(rest, start=len(first))
    ]
    follower = _Follower(view, mine)
    assert follow_batches(follower, iter(batches), math.inf, False) is None
    decode = BatchDecoder().decode
    for b in batches:
        decoded = decode(b.payload, b.seq)
        reference_view.apply(decoded, EPOCH)
        reference.after(reference_view, decoded.events, b.ts)
    assert follower.replayed == len(batches)
    return mine, reference, view, reference_view


@settings(max_examples=300, deadline=None)
@given(_payloads, _payloads)
def test_followed_from_the_read_as_from_decoded_events(
    first: list[bytes], rest: list[bytes]
) -> None:
    mine, reference, view, reference_view = _followed(first, rest)
    assert mine.result() == reference.result()
    assert mine.evicted_result() == reference.evicted_result()
    assert mine.children == reference.children
    assert mine._children == reference._children
    assert {k: t.counts() for k, t in view.tables.items()} == {
        k: t.counts() for k, t in reference_view.tables.items()
    }


def test_a_batch_the_read_takes_builds_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    first = [
        msgspec.msgpack.encode(
            [1.7e9, [{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 2}]]
        )
    ]
    rest = [
        msgspec.msgpack.encode(
            [
                1.7e9,
                [
                    {"type": "BlockRemoved", "block_hashes": [1]},
                    {"type": "BlockStored", "block_hashes": [5], "parent_block_hash": 1},
                    {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": 9},
                ],
            ]
        )
    ]

    def no_events(*args: Any) -> Any:
        raise AssertionError("an event built")

    # What `BatchRead.built` makes its events and batch of (compiled: it has no stub).
    fused_read = importlib.import_module("kvscope.collector._fused_read")
    for name in ("BlocksStored", "BlocksRemoved", "AllCleared", "Batch"):
        monkeypatch.setattr(fused_read, name, no_events)
    mine, _, view, _ = _followed(first, [])
    follower = _Follower(view, mine)
    batches = [LoggedBatch(1, 1.0, 1.0, rest[0])]
    assert follow_batches(follower, iter(batches), math.inf, False) is None
    monkeypatch.undo()
    assert [(o.hash, o.parent) for o in mine.result()] == [(7, 9)]
    assert [(o.hash, o.parent) for o in mine.evicted_result()] == [(2, 1), (5, 1)]
