"""The seam out of the collector: what a sink is told, and when it is asked to look at the map."""

from __future__ import annotations

from typing import Any

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import (
    NO_BATCH,
    AppliedBatch,
    ClearedMap,
    DegradedChange,
    DegradedStep,
    FanOut,
    MapReader,
    NullSink,
    ResumePoint,
    Span,
)
from kvscope.collector.types import StreamId, TableKey
from tests.test_ingest import CLEAR, frames, payload, remove, store

STREAM = StreamId("sink", 0)
GPU = TableKey("GPU", 0)


class Told(NullSink):
    """Records every call; `instant` returns the spans it is given, in turn."""

    def __init__(self, spans: list[Span] | None = None) -> None:
        self.spans = spans or []
        self.calls: list[tuple[str, object]] = []
        self.applied_batches: list[AppliedBatch] = []
        self.blocks_at_instants: list[tuple[float, int]] = []
        self.changes: list[DegradedChange] = []

    def applied(self, batch: AppliedBatch) -> None:
        self.calls.append(("applied", batch.seq))
        self.applied_batches.append(batch)

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        self.calls.append(("instant", ts))
        self.blocks_at_instants.append((ts, view.totals().blocks))
        return self.spans.pop(0) if self.spans else NO_BATCH

    def map_cleared(self, cleared: ClearedMap) -> None:
        self.calls.append(("cleared", cleared.seq))

    def degraded(self, change: DegradedChange) -> None:
        self.changes.append(change)


def feed(ingest: StreamIngest, *batches: tuple[int, float, list[dict[str, Any]]]) -> None:
    for seq, ts, events in batches:
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), 100.0 + seq)


def test_instant_comes_before_the_first_batch_past_the_span_and_sees_the_map_before_it() -> None:
    told = Told([Span(10.0, 11.0), Span(11.0, 12.5)])
    ingest = StreamIngest(STREAM, can_replay=False, sink=told)
    feed(
        ingest,
        (0, 10.2, [store(1, 2)]),
        (1, 10.9, [store(3, parent=2)]),
        (2, 11.0, [store(4, parent=3)]),  # the span's end is outside it
        (3, 12.4, [remove(4)]),
        (4, 12.5, [store(5)]),
    )
    assert told.calls == [
        ("instant", 10.2),
        ("applied", 0),
        ("applied", 1),
        ("instant", 11.0),
        ("applied", 2),
        ("applied", 3),
        ("instant", 12.5),
        ("applied", 4),
    ]
    # The map just before each batch asked about: what the batches before it left.
    assert told.blocks_at_instants == [(10.2, 0), (11.0, 3), (12.5, 3)]


def test_a_clear_and_a_resume_ask_again_before_the_next_batch() -> None:
    told = Told()  # NO_BATCH: no call is asked for
    ingest = StreamIngest(STREAM, can_replay=False, sink=told)
    feed(ingest, (0, 1.0, [store(1)]), (1, 2.0, [CLEAR, store(2)]), (2, 3.0, [store(3)]))
    feed(ingest, (3, 4.0, [store(4)]))
    assert told.calls == [
        ("instant", 1.0),
        ("applied", 0),
        ("cleared", 1),
        ("applied", 1),
        ("instant", 3.0),
        ("applied", 2),
        ("applied", 3),
    ]
    resumed = PrefixMap(STREAM)
    ingest.resume(ResumePoint(STREAM, resumed, 0, 3, payload(store(4), ts=4.0)))
    feed(ingest, (4, 5.0, [store(5)]), (5, 6.0, [store(6)]))
    assert told.calls[-3:] == [("instant", 5.0), ("applied", 4), ("applied", 5)]
    assert told.applied_batches[-1].view is resumed


def test_each_applied_batch_carries_its_per_table_changes_and_the_gaps_before_it() -> None:
    told = Told()
    ingest = StreamIngest(STREAM, can_replay=False, sink=told)
    cpu = {**store(100), "medium": "CPU"}
    feed(
        ingest,
        (0, 1.0, [store(1, 2), remove(1), cpu]),
        (1, 1.5, [store(3), CLEAR, store(4)]),
        (3, 2.0, [store(5)]),  # seq 2 is missing
    )
    got = [(b.seq, b.epoch, b.recv_ts, dict(b.changes), b.gaps) for b in told.applied_batches]
    assert got == [
        (0, 0, 100.0, {GPU: [2, 1], TableKey("CPU", 0): [1, 0]}, 0),
        (1, 0, 101.0, {GPU: [2, 0]}, 0),  # both sides of the clear
        (3, 0, 103.0, {GPU: [1, 0]}, 1),
    ]
    assert told.applied_batches[0].payload == payload(store(1, 2), remove(1), cpu, ts=1.0)


def test_degraded_intervals_are_told_as_they_open_and_close_one_per_gap() -> None:
    told = Told()
    ingest = StreamIngest(STREAM, can_replay=False, sink=told)
    feed(ingest, (0, 1.0, [store(1)]), (3, 2.0, [store(2)]), (6, 3.0, [store(3)]))
    feed(ingest, (7, 4.0, [CLEAR]))
    steps = [(c.step, c.from_seq, c.to_seq, c.cleared_at_seq) for c in told.changes]
    # Each gap is a cause of its own; the clear closes both.
    assert steps == [
        (DegradedStep.OPENED, 1, 2, None),
        (DegradedStep.OPENED, 4, 5, None),
        (DegradedStep.CLOSED, 1, 2, 7),
        (DegradedStep.CLOSED, 4, 5, 7),
    ]
    assert {(c.stream, c.reason) for c in told.changes} == {(STREAM, "gap not recovered")}


def test_fan_out_tells_every_sink_and_asks_within_all_their_spans() -> None:
    first, second = Told([Span(0.0, 2.0), NO_BATCH]), Told([Span(1.0, 5.0), NO_BATCH])
    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(first, second))
    feed(ingest, (0, 1.5, [store(1)]), (1, 1.9, [store(2)]), (2, 2.0, [store(3)]))
    expected = [("instant", 1.5), ("applied", 0), ("applied", 1), ("instant", 2.0), ("applied", 2)]
    assert first.calls == second.calls == expected
