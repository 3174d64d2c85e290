"""A map's counters (collector/_map_counters.pyx) as both compiled apply paths add them: the
Python loop's counts (tests/map_apply_reference.py), field for field, after a batch with each
kind of event, signed hashes and a clear, and as a clear's `on_clear` reads them."""

from __future__ import annotations

from typing import Any

from kvscope.collector._map_counters import MapCounters
from kvscope.collector._replay import replay
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearedMap
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from tests.map_apply_reference import reference_apply
from tests.test_ingest import CLEAR, payload, remove, store

STREAM = StreamId("r", 0)
FIELDS = [
    "batches",
    "stored_events",
    "removed_events",
    "cleared_events",
    "stored_blocks",
    "removed_blocks",
    "clears",
    "last_ts",
    "signed_hashes",
]
# Every kind of event: stores (one of signed hashes), removals, a clear between them.
EVERY_KIND = payload(
    store(1, 2, 3), store(-7, -8), remove(1), CLEAR, store(10), remove(10, 99), ts=5.0
)
EVERY_KIND_COUNTS = {
    "batches": 1,
    "stored_events": 3,
    "removed_events": 2,
    "cleared_events": 1,
    "stored_blocks": 6,
    "removed_blocks": 3,
    "clears": 1,
    "last_ts": 5.0,
    "signed_hashes": True,
}
AT_THE_CLEAR = {**EVERY_KIND_COUNTS, "stored_events": 2, "stored_blocks": 5}
AT_THE_CLEAR.update(removed_events=1, removed_blocks=1)


def watched() -> tuple[PrefixMap, list[dict[str, Any]]]:
    """A map, and its counters as each clear's `on_clear` read them."""
    prefix_map = PrefixMap(STREAM)
    seen: list[dict[str, Any]] = []

    def on_clear(cleared: ClearedMap) -> None:
        seen.append(prefix_map.counters.as_dict())

    prefix_map.on_clear = on_clear
    return prefix_map, seen


def test_a_new_map_counts_nothing() -> None:
    counters = PrefixMap(STREAM).counters
    assert list(counters.as_dict()) == FIELDS
    assert counters.as_dict() == dict.fromkeys(FIELDS, 0) | {"last_ts": None}
    assert counters.signed_hashes is False


def test_apply_counts_every_event_kind_as_the_python_loop() -> None:
    batch = BatchDecoder().decode(EVERY_KIND, 0)
    compiled, compiled_clears = watched()
    compiled.apply(batch)
    python, python_clears = watched()
    reference_apply(python, batch)
    assert compiled.counters.as_dict() == python.counters.as_dict() == EVERY_KIND_COUNTS
    assert compiled_clears == python_clears == [AT_THE_CLEAR]
    assert compiled.counters == python.counters
    assert compiled.signed_hashes


def test_fused_replay_counts_as_decode_and_apply() -> None:
    # The first and last batches are the fused path's; the second (signed hashes) is left to
    # decode + apply between them, the fused counts added first.
    payloads = [
        (0, payload(store(1, 2, 3), remove(1), CLEAR, store(10), ts=1.0)),
        (1, payload(store(-7, -8), remove(10), ts=2.0)),
        (2, payload(store(11, 12, parent=10), remove(2, 3), ts=3.0)),
    ]
    fused, fused_clears = watched()
    assert replay(fused, iter(payloads), 0) == 3
    today, today_clears = watched()
    decode = BatchDecoder().decode
    for seq, body in payloads:
        reference_apply(today, decode(body, seq))
    want = {
        "batches": 3,
        "stored_events": 4,
        "removed_events": 3,
        "cleared_events": 1,
        "stored_blocks": 8,
        "removed_blocks": 4,
        "clears": 1,
        "last_ts": 3.0,
        "signed_hashes": True,
    }
    assert fused.counters.as_dict() == today.counters.as_dict() == want
    first = {"batches": 1, "stored_events": 1, "stored_blocks": 3, "removed_events": 1}
    at_clear = dict(want, **first, removed_blocks=1, last_ts=1.0, signed_hashes=False)
    assert fused_clears == today_clears == [at_clear]


def test_python_reads_and_writes_each_field() -> None:
    # As the map's Python (a clear), a snapshot's restore and the API use them.
    counters = MapCounters()
    counters.clears += 2
    counters.signed_hashes = True
    counters.last_ts = 7.5
    assert counters.as_dict() == dict.fromkeys(FIELDS, 0) | {
        "clears": 2,
        "signed_hashes": True,
        "last_ts": 7.5,
    }
    counters.last_ts = None
    assert counters.last_ts is None
    assert counters != MapCounters()
    assert "clears=2" in repr(counters)
