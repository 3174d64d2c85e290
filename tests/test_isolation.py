"""Whatever one batch does, the stream goes on: an exception anywhere in a batch's path (the
decoder, the map, the store's sink) is counted by stage and kind, logged with the stream, seq
and the payload's first bytes, and marks that stream's map unknown, never another's."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, DegradedChange, DegradedStep, NullSink
from kvscope.collector.types import StreamId
from tests.test_ingest import CLEAR, frames, hashes, payload, store

STREAM = StreamId("r1", 0)


class FailingSink(NullSink):
    """A sink that raises on the batches named (a store hook with a bug)."""

    def __init__(self, fail_at: set[int], exc: type[Exception] = RuntimeError) -> None:
        self.fail_at = fail_at
        self.exc = exc
        self.applied_seqs: list[int] = []
        self.degraded_changes: list[DegradedChange] = []

    def applied(self, batch: AppliedBatch) -> None:
        if batch.seq in self.fail_at:
            raise self.exc(f"sink broke at seq {batch.seq}")
        self.applied_seqs.append(batch.seq)

    def degraded(self, change: DegradedChange) -> None:
        self.degraded_changes.append(change)


def feed(ingest: StreamIngest, seqs: range, **kw: Any) -> None:
    for seq in seqs:
        parent = None if seq == 0 else seq
        ingest.live_frames(frames(seq, payload(store(seq + 1, parent=parent), **kw)), float(seq))


def test_an_exception_in_the_sink_is_counted_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FailingSink({3})
    ingest = StreamIngest(STREAM, can_replay=False, sink=sink)
    with caplog.at_level(logging.WARNING):
        feed(ingest, range(7))
    assert ingest.counters.ingest_errors == {("live", "RuntimeError"): 1}
    assert ingest.last_seq == 6
    assert hashes(ingest) == set(range(1, 8))
    assert sink.applied_seqs == [0, 1, 2, 4, 5, 6]
    # The store missed seq 3: what it holds from there is not the map, and it is told so.
    assert ingest.degraded is not None and ingest.degraded.from_seq == 3
    assert [c.from_seq for c in sink.degraded_changes] == [3]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "r1" in logged and "seq 3" in logged and "RuntimeError" in logged
    assert payload(store(4, parent=3))[:8].hex() in logged


def test_an_exception_while_degrading_does_not_escape_either() -> None:
    class Broken(FailingSink):
        def degraded(self, change: DegradedChange) -> None:
            raise OSError("the store hook is broken too")

    ingest = StreamIngest(STREAM, can_replay=False, sink=Broken({2}))
    feed(ingest, range(5))
    assert ingest.last_seq == 4
    assert ingest.counters.ingest_errors[("live", "RuntimeError")] == 1
    assert ingest.counters.ingest_errors[("live", "OSError")] == 1


def test_a_clear_after_the_failure_makes_the_map_known_again() -> None:
    sink = FailingSink({1})
    ingest = StreamIngest(STREAM, can_replay=False, sink=sink)
    feed(ingest, range(3))
    assert ingest.degraded is not None
    ingest.live_frames(frames(3, payload(CLEAR)), 3.0)
    assert ingest.degraded is None
    ingest.live_frames(frames(4, payload(store(9))), 4.0)
    assert hashes(ingest) == {9}


def test_an_exception_in_a_replay_reply_ends_that_replay_not_the_stream() -> None:
    sink = FailingSink({2})
    ingest = StreamIngest(STREAM, can_replay=True, sink=sink)
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    request = ingest.live_frames(frames(3, payload(store(4, parent=3))), 1.0)
    assert request is not None and request.start_seq == 1
    for seq in (1, 2):
        body = payload(store(seq + 1, parent=seq))
        assert not ingest.replay_frames([b"", b"topic", seq.to_bytes(8, "big"), body], 1.0)
    assert ingest.counters.ingest_errors[("replay", "RuntimeError")] == 1
    ingest.replay_frames([b"", b"topic", b"\xff" * 8, b""], 1.0)
    assert not ingest.replaying
    assert ingest.last_seq == 3
    assert hashes(ingest) == {1, 2, 3, 4}


def test_each_cause_is_its_own_degraded_interval_and_a_clear_closes_them_all() -> None:
    sink = FailingSink(set())
    ingest = StreamIngest(STREAM, can_replay=False, sink=sink)
    ingest.live_frames(frames(3, payload(store(1))), 0.0)  # joined mid-stream: 0..2 missing
    ingest.live_frames(frames(4, payload(store(2, parent=1))), 1.0)
    ingest.live_frames(frames(9, payload(store(3, parent=2))), 2.0)  # a gap: 5..8
    ingest.live_frames(frames(10, payload(store(4, parent=3))), 3.0)
    ingest.live_frames(frames(15, payload(store(5, parent=4))), 4.0)  # another: 11..14
    opened = [(c.reason, c.from_seq, c.to_seq) for c in sink.degraded_changes]
    assert opened == [
        ("joined mid-stream", 0, 2),
        ("gap not recovered", 5, 8),
        ("gap not recovered", 11, 14),
    ]
    assert ingest.degraded is not None and ingest.degraded.from_seq == 0  # unknown since 0
    assert ingest.counters.gaps == 2
    ingest.live_frames(frames(16, payload(CLEAR)), 5.0)
    assert ingest.degraded is None
    closed = [c for c in sink.degraded_changes if c.step == "closed"]
    assert [(c.from_seq, c.cleared_at_seq) for c in closed] == [(0, 16), (5, 16), (11, 16)]


def test_consecutive_refusals_of_one_kind_widen_one_interval() -> None:
    sink = FailingSink(set())
    ingest = StreamIngest(STREAM, can_replay=False, sink=sink)
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    for seq in range(1, 50):
        ingest.live_frames(frames(seq, b"\xc1"), float(seq))  # not msgpack
    assert [c.step for c in sink.degraded_changes].count(DegradedStep.OPENED) == 1
    assert ingest.degraded is not None and ingest.degraded.to_seq == 49
