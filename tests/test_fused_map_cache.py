"""One `FusedApply` serves every stream of a fleet, and each map keeps the table its last fused
batch wrote to (`MapCore`'s cache, collector/_replay.pyx), so that maps taking turns at the
reader do not look their table up each batch. Maps taking turns, cleared by a batch, or handed
other tables (as a checkpoint's restore does) must end as each map decoded and applied alone."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector._replay import FusedApply
from kvscope.collector.errors import MalformedPayload
from kvscope.collector.limits import IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from tests.test_replay_fused import EPOCH, batch, encode, map_state
from tests.wire_fast_strategies import SETTINGS
from tests.wire_fast_support import MAX_BS

LIMITS = IngestLimits(max_block_size=MAX_BS)
DECODE = BatchDecoder(LIMITS).decode


def fused_apply(reader: FusedApply, prefix_map: PrefixMap, seq: int, payload: bytes) -> Any:
    """The batch applied through the shared reader (decoded where it declines): its refusal."""
    try:
        if reader.live(prefix_map, payload, seq, EPOCH, False, None, MAX_BS) < 0:
            prefix_map.apply(DECODE(payload, seq), EPOCH)
    except MalformedPayload as exc:
        return (exc.kind, exc.detail)
    return None


def decoded_apply(prefix_map: PrefixMap, seq: int, payload: bytes) -> Any:
    try:
        prefix_map.apply(DECODE(payload, seq), EPOCH)
    except MalformedPayload as exc:
        return (exc.kind, exc.detail)
    return None


def maps(n: int) -> list[PrefixMap]:
    made = [PrefixMap(StreamId(f"r{i}", i)) for i in range(n)]
    for prefix_map in made:
        prefix_map.limits = LIMITS
    return made


@SETTINGS
@given(st.data())
def test_maps_taking_turns_at_one_reader_end_as_each_applied_alone(data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 3))
    # (map, batch), or (map, None): that map's tables replaced by a new, empty dict.
    steps = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.none() | batch() | batch()), max_size=16)
    )
    reader = FusedApply()
    fused, today = maps(n), maps(n)
    for seq, (i, value) in enumerate(steps):
        if value is None:
            fused[i].tables, today[i].tables = {}, {}
            continue
        payload = encode(data, value)
        assert fused_apply(reader, fused[i], seq, payload) == decoded_apply(today[i], seq, payload)
    for mine, theirs in zip(fused, today, strict=True):
        assert map_state(mine) == map_state(theirs)


def test_a_map_cleared_between_its_turns_writes_to_its_new_table() -> None:
    """The table a map wrote to last is the cleared dict's: the next batch must not reach it."""
    store = {"type": "BlockStored", "block_hashes": [1], "block_size": 0, "medium": "GPU"}
    other = {**store, "block_hashes": [2]}
    cleared = [1.7e9, [{"type": "AllBlocksCleared"}, other]]
    reader = FusedApply()
    fused, today = maps(2), maps(2)
    plan = [(0, [1.7e9, [store]]), (1, [1.7e9, [store]]), (0, cleared), (1, [1.7e9, [other]])]
    plan += [(0, [1.7e9, [store]])]
    for seq, (i, value) in enumerate(plan):
        payload = msgspec.msgpack.encode(value)
        assert reader.live(fused[i], payload, seq, EPOCH, False, None, MAX_BS) >= 0
        assert decoded_apply(today[i], seq, payload) is None
    for mine, theirs in zip(fused, today, strict=True):
        assert map_state(mine) == map_state(theirs)
    assert sorted(e.hash for t in fused[0].tables.values() for e in t.entries()) == [1, 2]


def test_a_map_cleared_the_usual_way_keeps_no_old_table_alive() -> None:
    """A clear outside the fused path (a batch decoded and applied) replaces the tables: the
    table the last fused batch wrote to must go with them, not stay for the cache."""
    store = {"type": "BlockStored", "block_hashes": [1], "block_size": 0, "medium": "GPU"}
    (prefix_map,) = maps(1)
    payload = msgspec.msgpack.encode([1.7e9, [store]])
    assert FusedApply().live(prefix_map, payload, 0, EPOCH, False, None, MAX_BS) >= 0
    (table,) = prefix_map.tables.values()
    old = weakref.ref(table)
    del table
    clear = msgspec.msgpack.encode([1.7e9, [{"type": "AllBlocksCleared"}]])
    prefix_map.apply(DECODE(clear, 1), EPOCH)
    gc.collect()
    assert old() is None
