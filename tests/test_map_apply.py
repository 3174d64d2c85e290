"""The compiled apply (collector/_map_apply.pyx, behind `PrefixMap.apply`) against the Python
loop it replaced (tests/map_apply_reference.py): on random batches of every shape the map must
end the same, table for table and slot for slot, with the same counters, changes, clears handed
to `on_clear`, refusals and exceptions."""

from __future__ import annotations

from array import array
from dataclasses import asdict
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector import _map_apply
from kvscope.collector.block_table import BlockTable
from kvscope.collector.limits import IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearedMap
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    StreamId,
    TableKey,
)
from tests.map_apply_reference import reference_apply
from tests.test_replay_fused import map_state

STREAM = StreamId("r", 0)
KEYS = [TableKey("GPU", 0), TableKey("GPU", 1), TableKey("CPU", 0), TableKey("disk", 3)]
LIMITS = [
    IngestLimits(),
    IngestLimits(max_blocks_per_stream=12),  # near it: admit counts, and refuses
    IngestLimits(max_tables_per_stream=2),
    IngestLimits(max_token_bytes_per_stream=300),
]
# A small universe: re-stores, removes of cached and unknown hashes, parents cached or not.
HASH = st.integers(1, 14) | st.sampled_from([0, (1 << 64) - 1])
BAD_HASH = st.sampled_from([-1, 1 << 64])  # raises mid-batch, as store_chain and remove do
HASHES = st.lists(HASH, max_size=6) | st.lists(HASH | BAD_HASH, min_size=1, max_size=3)


@st.composite
def table_key(draw: st.DrawFn) -> TableKey:
    key = draw(st.sampled_from(KEYS))
    # An equal key that is another object: the map keys tables by equality.
    return TableKey(key.medium, key.group) if draw(st.booleans()) else key


@st.composite
def tokens(draw: st.DrawFn, n: int, block_size: int) -> Any:
    count = n * block_size + draw(st.sampled_from([0, 0, 0, 1, -1]))
    values = [
        draw(st.integers(0, 3)) * draw(st.sampled_from([1, 1000, 1 << 20]))
        for _ in range(max(count, 0))
    ]
    kind = draw(st.sampled_from(["I", "I", "I", "list", "L"]))
    return values if kind == "list" else array(kind, values)


@st.composite
def stored(draw: st.DrawFn) -> BlocksStored:
    hashes = draw(HASHES)
    block_size = draw(st.sampled_from([4, 4, 4, 2, 0]))
    rare = draw(st.integers(0, 5)) == 0
    raw = rare and draw(st.booleans())
    return BlocksStored(
        hashes=hashes,
        parent=draw(st.none() | HASH),
        token_ids=draw(tokens(len(hashes), block_size)),
        block_size=block_size,
        table=draw(table_key()),
        lora_name=draw(st.none() | st.just("lora")) if rare else None,
        extra_keys=draw(st.none() | st.just([["salt"]] * len(hashes))) if rare else None,
        raw_hashes=[h.to_bytes(9, "big", signed=True) for h in hashes] if raw else None,
        raw_parent=b"\x01" * 9 if raw and draw(st.booleans()) else None,
        signed_hashes=draw(st.integers(0, 9)) == 0,
    )


@st.composite
def removed(draw: st.DrawFn) -> BlocksRemoved:
    return BlocksRemoved(draw(HASHES), draw(table_key()))


EVENT = st.one_of(stored(), stored(), removed(), removed(), st.just(AllCleared()))


@st.composite
def batches(draw: st.DrawFn) -> list[Batch]:
    made = []
    for seq in range(draw(st.integers(1, 12))):
        events: list[KVEvent] = draw(st.lists(EVENT, max_size=8))
        if events and draw(st.integers(0, 30)) == 0:
            # An event naming no table first: no table is in use yet, so it raises (later,
            # None would key a table, which `map_state` cannot show).
            first = events[0]
            if not isinstance(first, AllCleared):
                first.table = None  # type: ignore[assignment]
        ts = 1.7e9 + draw(st.floats(-5, 50, allow_nan=False))
        made.append(Batch(seq, ts, 0, events, payload_bytes=draw(st.sampled_from([0, 200]))))
    return made


def run(apply: Any, stream: list[Batch], limits: IngestLimits) -> list[Any]:
    """What each batch did (its changes or its exception, the clears it handed over) and the
    map after it."""
    clears: list[Any] = []
    prefix_map = PrefixMap(STREAM)
    prefix_map.limits = limits

    def on_clear(cleared: ClearedMap) -> None:
        # What a sink could read then: the cleared tables and the map's counters.
        emptied = PrefixMap(STREAM)
        emptied.tables = cast(dict[TableKey, BlockTable], dict(cleared.tables))
        emptied.counters = prefix_map.counters
        fields = asdict(cleared) if hasattr(cleared, "__dataclass_fields__") else vars(cleared)
        clears.append(({k: v for k, v in fields.items() if k != "tables"}, map_state(emptied)))

    prefix_map.on_clear = on_clear
    seen = []
    for i, batch in enumerate(stream):
        try:
            done: Any = apply(prefix_map, batch, i % 3, i % 2 == 1, 1.8e9 + i)
        except Exception as exc:
            done = (type(exc), str(exc))
        seen.append((done, clears[:], map_state(prefix_map)))
        clears.clear()
    return seen


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from(LIMITS))
def test_compiled_apply_is_the_python_loop(stream: list[Batch], limits: IngestLimits) -> None:
    assert run(PrefixMap.apply, stream, limits) == run(reference_apply, stream, limits)


def test_prefix_map_applies_through_the_compiled_loop() -> None:
    prefix_map = PrefixMap(STREAM)
    assert PrefixMap.apply is _map_apply.apply_batch
    changes = prefix_map.apply(
        Batch(0, 1.0, 0, [BlocksStored([1, 2], None, array("I", [5] * 8), 4, KEYS[0])])
    )
    assert changes == {KEYS[0]: [2, 0]}
    assert prefix_map.counters.stored_blocks == 2
