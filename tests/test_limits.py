"""Every size a publisher controls has a limit (collector/limits.py): a batch over one is refused
whole with its kind, the map is untouched by it, memory does not jump, and the next honest batch
applies. The hostile batches are issue 12's, sent through a stream's ingest as live frames."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector._admit import admit
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.limits import DEFAULT_LIMITS, IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import MapReader, NullSink, Span
from kvscope.collector.snapshot import encode_map
from kvscope.collector.types import AllCleared, Batch, BlocksRemoved, BlocksStored, StreamId
from kvscope.collector.wire import BatchDecoder, table_key
from tests.wire_fast_strategies import SETTINGS, batch, encoded
from tests.wire_fast_support import MAX_BS

E = msgspec.msgpack.encode
STREAM = StreamId("r", 0)
GPU0 = table_key("GPU", 0)


def stored(*hashes: int, parent: int | None = None, group: int = 0, **kw: Any) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": [h % 1000 for h in hashes for _ in range(16)],
        "block_size": 16,
        "medium": "GPU",
        "group_idx": group,
        **kw,
    }


def frames(seq: int, events: list[Any], ts: Any = 1.0) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), E([ts, events, 0])]


@contextmanager
def allocated() -> Iterator[Callable[[], int]]:
    """The peak bytes Python allocated inside the block (tracemalloc)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        yield lambda: tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def snapshot(prefix_map: PrefixMap) -> tuple[bytes, object]:
    """The map and its counters, to tell whether a batch changed anything."""
    return encode_map(prefix_map), prefix_map.counters.as_dict()


def decoded(prefix_map: PrefixMap, seq: int, events: list[Any]) -> Batch:
    return BatchDecoder(prefix_map.limits).decode(E([1.0, events, 0]), seq)


def apply(prefix_map: PrefixMap, seq: int, events: list[Any]) -> None:
    prefix_map.apply(decoded(prefix_map, seq, events))


def refused(prefix_map: PrefixMap, seq: int, events: list[Any]) -> MalformedPayload:
    batch = decoded(prefix_map, seq, events)
    before = snapshot(prefix_map)
    with allocated() as peak, pytest.raises(MalformedPayload) as caught:
        prefix_map.apply(batch)
    assert peak() < 64 * 1024  # the refusal's message, no table
    assert snapshot(prefix_map) == before  # nothing of it applied
    assert caught.value.kind is MalformedKind.LIMIT_EXCEEDED
    return caught.value


# --- the map's limits ----------------------------------------------------------------------------
def test_tables_per_stream() -> None:
    # Issue 12: one batch naming 3,000 groups made 3,000 tables of ~390 KB each.
    prefix_map = PrefixMap(STREAM)
    apply(prefix_map, 0, [stored(1)])
    error = refused(prefix_map, 1, [stored(g, group=g) for g in range(300)])
    assert "max_tables_per_stream=64" in error.detail
    # Removals name tables too (a removal from an unknown table makes it).
    removals = [{"type": "BlockRemoved", "block_hashes": [1], "group_idx": g} for g in range(65)]
    refused(prefix_map, 2, removals)
    apply(prefix_map, 3, [stored(2, parent=1), *[stored(g, group=g) for g in range(1, 64)]])
    assert len(prefix_map.tables) == DEFAULT_LIMITS.max_tables_per_stream
    # After a clear in the same batch, the tables are counted from none.
    apply(prefix_map, 4, [{"type": "AllBlocksCleared"}, *[stored(g, group=g) for g in range(64)]])
    assert len(prefix_map.tables) == 64


def test_blocks_per_stream() -> None:
    prefix_map = PrefixMap(STREAM)
    prefix_map.limits = IngestLimits(max_blocks_per_stream=100)
    apply(prefix_map, 0, [stored(*range(90))])
    error = refused(prefix_map, 1, [stored(*range(1000, 1011))])
    assert "max_blocks_per_stream=100" in error.detail
    apply(prefix_map, 2, [stored(*range(1000, 1010))])
    assert prefix_map.totals().blocks == 100
    refused(prefix_map, 3, [stored(5000), {"type": "AllBlocksCleared"}])
    # Removals make room within the limit only once applied: a batch counts every store.
    apply(prefix_map, 4, [{"type": "BlockRemoved", "block_hashes": list(range(50))}])
    apply(prefix_map, 5, [{"type": "AllBlocksCleared"}, stored(*range(2000, 2100))])
    assert prefix_map.totals().blocks == 100


def test_token_bytes_per_stream() -> None:
    prefix_map = PrefixMap(STREAM)
    # 16 tokens a block, 4 bytes a token; the first store reserves the column's first step.
    prefix_map.limits = IngestLimits(max_token_bytes_per_stream=2**20)
    apply(prefix_map, 0, [stored(*range(1000))])
    held = prefix_map.tables[GPU0].token_bytes()
    room = (2**20 - held) // 64
    error = refused(prefix_map, 1, [stored(*range(5000, 5001 + room))])
    assert "max_token_bytes_per_stream" in error.detail
    # Extra keys (cache salts, multimodal identifiers) are kept with the tokens, and count.
    salted = [["s" * 100]] * room
    refused(prefix_map, 2, [stored(*range(5000, 5000 + room), extra_keys=salted)])
    apply(prefix_map, 3, [stored(*range(5000, 5000 + room))])


def test_copies_per_block_saturate_instead_of_wrapping() -> None:
    prefix_map = PrefixMap(STREAM)
    hits = BlocksStored([7], None, [1] * 16, 16, GPU0)
    prefix_map.apply(Batch(0, 1.0, 0, [hits] * 70_000))
    table = prefix_map.tables[GPU0]
    assert table.count(7) == 70_000 and table.saturated_stores == 0
    prefix_map.apply(Batch(1, 2.0, 0, [BlocksRemoved([7] * 69_999, GPU0), AllCleared()]))
    assert prefix_map.tables == {}


@SETTINGS
@given(st.data())
def test_the_bound_from_the_payload_size_refuses_what_counting_refuses(data: st.DataObject) -> None:
    # Most batches are admitted on their payload's size alone; counting their events must
    # never refuse one of those.
    limits = IngestLimits(
        max_block_size=MAX_BS,
        max_tables_per_stream=data.draw(st.integers(1, 3) | st.integers(1, 70)),
        max_blocks_per_stream=data.draw(st.integers(0, 20) | st.integers(0, 3000)),
        max_token_bytes_per_stream=data.draw(st.integers(0, 2000) | st.integers(0, 30_000)),
    )
    prefix_map = PrefixMap(STREAM)
    prefix_map.limits = limits
    decoder = BatchDecoder(limits)
    for seq in range(3):
        try:
            decoded = decoder.decode(encoded(data, data.draw(batch(data.draw(st.booleans())))), seq)
        except MalformedPayload:
            continue
        counted = msgspec.structs.replace(decoded, payload_bytes=0)
        outcomes: list[str | None] = []  # what each refused, None where admitted
        for each in (decoded, counted):
            try:
                admit(limits, prefix_map.tables, each)
                outcomes.append(None)
            except MalformedPayload as exc:
                outcomes.append(exc.detail)
        assert outcomes[0] == outcomes[1]
        if outcomes[0] is None:
            prefix_map.apply(decoded)


# --- issue 12's batches, through a stream's ingest ----------------------------------------------
class SecondsOfTheStore(NullSink):
    """Asks for the map at each second, as the store's rollups do: `int(ts)` of every stamp."""

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        second = int(ts)
        return Span(second, second + 1)


HOSTILE: list[tuple[str, list[Any], Any, str]] = [
    ("type is a list", [{"type": ["BlockStored"], "block_hashes": [9]}], 1.0, "bad_event"),
    ("token_ids nil", [stored(9, token_ids=None)], 1.0, "bad_event"),
    ("block_size nil", [stored(9, block_size=None)], 1.0, "bad_event"),
    ("block_size 2**63", [stored(9, block_size=2**63)], 1.0, "limit_exceeded"),
    # 148 bytes that allocated 1 GB: room for 4,096 blocks of 65,536 tokens
    (
        "block_size 65536",
        [stored(9, token_ids=[], block_size=65_536, group=1)],
        1.0,
        "limit_exceeded",
    ),
    ("3,000 groups", [stored(9, group=g) for g in range(3000)], 1.0, "limit_exceeded"),
    ("NaN ts", [stored(9)], float("nan"), "bad_batch"),
    ("infinite ts", [stored(9)], float("inf"), "bad_batch"),
    ("a hash too wide", [stored(9, block_hashes=[b"h" * 100])], 1.0, "bad_event"),
]


@pytest.mark.parametrize(("name", "events", "ts", "kind"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_batch_is_refused_counted_and_the_next_applies(
    name: str, events: list[Any], ts: Any, kind: str
) -> None:
    ingest = StreamIngest(STREAM, can_replay=False, sink=SecondsOfTheStore())
    ingest.live_frames(frames(0, [stored(1)]), 0.0)
    before = snapshot(ingest.map)
    with allocated() as peak:
        ingest.live_frames(frames(1, [stored(2, parent=1), *events], ts), 0.0)
        assert peak() < 8 * 2**20
    assert ingest.counters.malformed == {kind: 1}
    assert ingest.degraded is not None  # what the batch would have changed is unknown
    assert snapshot(ingest.map) == before
    ingest.live_frames(frames(2, [stored(3, parent=1)]), 0.0)
    assert {h for h, _ in ingest.map.counts()} == {1, 3}
    assert ingest.counters.batches_applied == 2


def test_nesting_2000_deep_is_refused_not_raised() -> None:
    ingest = StreamIngest(STREAM, can_replay=False)
    deep = b"\x93\xcb" + bytes(8) + b"\x91" + b"\x91" * 2000 + b"\xc0\x00"
    ingest.live_frames([b"", bytes(8), deep], 0.0)
    assert ingest.counters.malformed == {"undecodable_payload": 1}
    ingest.live_frames(frames(1, [stored(1)]), 0.0)
    assert ingest.counters.batches_applied == 1
