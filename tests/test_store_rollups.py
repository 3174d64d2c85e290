"""Per-second rollups: what each tier held at the end of each second, and what changed in it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from sqlalchemy import select

from kvscope.collector.block_table import TableStats
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, MapReader, NullSink, ResumePoint, Span
from kvscope.collector.types import StreamId, TableKey
from kvscope.collector.wire import table_key
from kvscope.storage import rollups, schema
from kvscope.storage._rollup_counts import RollupCounts, SecondCore
from kvscope.storage.engine import open_store
from kvscope.storage.rows import RollupRow
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import CLEAR, frames, payload, remove, store

STREAM = StreamId("roll", 0)


def cpu(event: dict[str, Any]) -> dict[str, Any]:
    return {**event, "medium": "CPU"}


# (seq, ts, events): one table, then two, a clear in the middle of a second, a gap (seq 7).
BATCHES: list[tuple[int, float, list[dict[str, Any]]]] = [
    (0, 10.1, [store(1, 2)]),
    (1, 10.5, [store(3, parent=2), remove(1)]),
    (2, 11.2, [cpu(store(100, 101)), store(4, parent=3)]),
    (3, 11.7, [cpu(remove(100))]),
    (4, 12.0, [store(5, parent=4), CLEAR, store(7)]),
    (5, 12.5, [store(8, parent=7), store(9, parent=8)]),
    (6, 12.9, [remove(9)]),
    (8, 13.3, [store(10, parent=8)]),
    (9, 14.0, [store(11, parent=10)]),
]

# Blocks stored and removed per (second, medium), clears and gaps per second.
CHANGES = {
    (10, "GPU"): (3, 1),
    (11, "GPU"): (1, 0),
    (11, "CPU"): (2, 1),
    (12, "GPU"): (4, 1),
    (13, "GPU"): (1, 0),
    (14, "GPU"): (1, 0),
}
CLEARS = {12: 1}
GAPS = {13: 1}


def _ingest_into(writer: StoreWriter) -> StreamIngest:
    return StreamIngest(STREAM, can_replay=False, sink=writer)


def test_each_second_holds_the_map_after_its_last_batch_and_its_changes(store_url: str) -> None:
    writer = StoreWriter(open_store(store_url), StoreSettings())
    live = _ingest_into(writer)
    plain = StreamIngest(STREAM, can_replay=False)
    at_end_of: dict[int, dict[str, TableStats]] = {}
    for seq, ts, events in BATCHES:
        body = payload(*events, ts=ts)
        live.live_frames(frames(seq, body), ts)
        plain.live_frames(frames(seq, body), ts)
        at_end_of[int(ts)] = {k.medium: s for k, s in plain.map.stats().items()}
    writer.close()

    with writer.engine.connect() as conn:
        rows = conn.execute(
            select(schema.rollups).order_by(schema.rollups.c.second, schema.rollups.c.medium)
        ).all()
    # The last second too: closing the writer writes the second still open.
    got = {(r.second, r.medium): r for r in rows}
    expected_keys = {(s, m) for s in range(10, 15) for m in at_end_of[s]} | set(CHANGES)
    assert set(got) == expected_keys
    for (second, medium), row in got.items():
        held = at_end_of[second].get(medium)
        assert (row.stored, row.hittable, row.orphans) == (
            (held.blocks, held.hittable, held.orphans) if held else (0, 0, 0)
        ), (second, medium)
        assert (row.stores, row.removes) == CHANGES.get((second, medium), (0, 0)), (second, medium)
        assert (row.clears, row.gaps) == (CLEARS.get(second, 0), GAPS.get(second, 0))
        assert row.grp == 0


def test_a_map_loaded_after_a_crash_counts_only_what_comes_after(store_url: str) -> None:
    # The map that `resume` hands over already counted the batches replayed into it: those
    # were rolled up before the crash and must not be counted again.
    before = StreamIngest(STREAM, can_replay=False)
    for seq, ts, events in BATCHES[:4]:
        before.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer = StoreWriter(open_store(store_url), StoreSettings())
    live = _ingest_into(writer)
    live.resume(ResumePoint(STREAM, before.map, 0, 3, payload(*BATCHES[3][2], ts=BATCHES[3][1])))
    for seq, ts, events in BATCHES[4:]:
        live.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()

    with writer.engine.connect() as conn:
        rows = conn.execute(select(schema.rollups)).all()
    got = {(r.second, r.medium): (r.stores, r.removes) for r in rows if r.stores or r.removes}
    assert got == {key: counts for key, counts in CHANGES.items() if key[0] >= 12}


class _Rolled(NullSink):
    """The rollup alone, fed as the store's writer feeds it."""

    def __init__(self) -> None:
        self.rollup = rollups.SecondRollup(STREAM)

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        self.rollup.instant(view, ts)
        return self.rollup.span()

    def applied(self, batch: AppliedBatch) -> None:
        self.rollup.counts.applied(batch)


def test_a_clock_stuck_in_one_second_sums_every_batch() -> None:
    sink = _Rolled()
    live = StreamIngest(STREAM, can_replay=False, sink=sink)
    for seq in range(50):
        live.live_frames(frames(seq, payload(store(seq + 1), ts=7.5)), 7.5)
    (row,) = sink.rollup.close()
    assert (row.second, row.stores, row.removes, row.stored) == (7, 50, 0, 50)


def test_a_seconds_sums_leave_each_batchs_changes_as_they_were() -> None:
    """The sums are kept beside the batches' own lists (the map made them), never in them; a
    table only named, by events of no block, gets no sum."""
    gpu, cpu, named = (table_key(medium, 0) for medium in ("GPU", "CPU", "DISK"))
    changes: list[Mapping[TableKey, Sequence[int]]] = [
        {gpu: [3, 1], named: [0, 0]},
        {},
        {gpu: (2, 2), cpu: [0, 4]},
        {gpu: [1, 0]},
    ]
    before = repr(changes)
    counts = RollupCounts()
    assert [counts.count(change) for change in changes] == [4, 0, 8, 1]  # block-events
    assert counts.take() == ({gpu: (6, 3), cpu: (0, 4)}, 0)
    assert repr(changes) == before
    assert counts.take() == ({}, 0)  # taken: counted again from 0


def test_a_tables_sums_are_found_by_an_equal_key_not_only_the_interned_one() -> None:
    counts = RollupCounts()
    counts.count({table_key("GPU", 0): [2, 0]})
    counts.count({TableKey("GPU", 0): [1, 1], TableKey("GPU", 1): [5, 0]})
    counts.count({f"t{i}": [1, 0] for i in range(9)})  # more tables than first made room for
    expected: dict[object, tuple[int, int]] = {
        table_key("GPU", 0): (3, 1),
        TableKey("GPU", 1): (5, 0),
        **{f"t{i}": (1, 0) for i in range(9)},
    }
    assert counts.take()[0] == expected


class _StatsOnly:
    """A map read only through its `stats()` (any `MapReader` but a `PrefixMap`)."""

    def __init__(self, view: MapReader) -> None:
        self._view = view

    def stats(self) -> dict[TableKey, TableStats]:
        return self._view.stats()


def test_a_seconds_rows_read_a_prefix_map_as_its_stats_give_it() -> None:
    """A `PrefixMap`'s tables are read from their C fields: the rows are those its `stats()`
    gives, each the `RollupRow` its `__init__` makes."""
    plain = StreamIngest(STREAM, can_replay=False)
    # Two tables, orphans in both (block 1 removed under 2 and 3), a hittable block in one.
    for seq, ts, events in [*BATCHES[:4], (4, 11.9, [store(20)])]:
        plain.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    stats = plain.map.stats()
    assert {key.medium for key in stats} == {"GPU", "CPU"}
    assert any(s.orphans for s in stats.values()) and any(s.hittable for s in stats.values())
    rows = {}
    for view in (plain.map, _StatsOnly(plain.map)):
        rollup = rollups.SecondRollup(STREAM)
        rollup.instant(view, 20.5)
        rollup.counts.count({table_key("GPU", 0): [2, 1]})
        rows[type(view)] = sorted(rollup._rows(view), key=lambda row: row.medium)
    assert rows[type(plain.map)] == rows[_StatsOnly]
    assert rows[_StatsOnly] == [
        RollupRow(STREAM, 20, key.medium, key.group, s.blocks, s.hittable, s.orphans, *changes)
        for key, s, changes in sorted(
            (
                (key, s, (2, 1, 0, 0) if key.medium == "GPU" else (0, 0, 0, 0))
                for key, s in stats.items()
            ),
            key=lambda item: item[0].medium,
        )
    ]
    assert all(type(row) is RollupRow for row in rows[type(plain.map)])


def test_a_seconds_span_is_bounded_by_floats() -> None:
    """The collector compares every batch's stamp (a float) with the span's bounds: an int
    bound past 2**30 is converted in each comparison. The same stamps are within it."""
    rollup = rollups.SecondRollup(STREAM)
    rollup.instant(StreamIngest(STREAM, can_replay=False).map, 1_796_051_000.25)
    since, until = rollup.span()
    assert (type(since), type(until)) == (float, float)
    assert (since, until) == (1_796_051_000, 1_796_051_001)


def test_a_rollup_without_counts_is_refused_not_written_through() -> None:
    """The C base's counts are a C field, written at each instant: one never set is an error."""
    with pytest.raises(ValueError, match="without counts"):
        SecondCore().instant(StreamIngest(STREAM, can_replay=False).map, 1.5)
