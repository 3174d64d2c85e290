"""The store's sink in C (storage/_store_sink.pyx) queues what the Python `applied` it replaced
queued, batch for batch, for several streams told in turns (as a fleet's drain tells them), a
stream forgotten and taken again, restarts, and a queue that overflows; and so does its
`instant`, in C with its rollup's (storage/_rollup_counts.pyx), what the Python one queued."""

from __future__ import annotations

import math
import random
import sys
from types import FrameType
from typing import Any

import pytest

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import EVERY_BATCH, AppliedBatch, MapReader, Span
from kvscope.collector.types import StreamId
from kvscope.storage import write_loop
from kvscope.storage.engine import open_store
from kvscope.storage.rows import EpochRow
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import frames, payload
from tests.test_store_sink_rows import _canonical, _events


class _Python(StoreWriter):
    """`applied` and `instant` as they were in Python before the sink moved into C."""

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        state = self._streams.get(stream) or self._state(stream)
        if state.recoveries.followed:
            for recovery in state.recoveries.before_batch(view, ts):
                self._put_always(recovery)
        rollup = state.rollup
        rollup.counts.view = view
        second = int(ts)
        if second != rollup.second:
            rows = [] if rollup.second is None else rollup._rows(view)
            rollup.second = second
            for row in rows:
                self._queue.put_batch(row, 0)
        second = rollup.second
        span = (
            EVERY_BATCH if second is None or second < 0 else Span(float(second), float(second + 1))
        )
        if not state.recoveries.followed:
            return span
        for at in state.recoveries.next_instants():
            span = span.within(Span(-math.inf, math.nextafter(at, math.inf)))
        return span

    def applied(self, batch: AppliedBatch) -> None:
        stream, epoch = batch.stream, batch.epoch
        state = self._streams.get(stream) or self._state(stream)
        if state.epoch != epoch:
            state.epoch = epoch
            self._put_always(EpochRow(stream, epoch, batch.recv_ts))
        events = state.rollup.counts.applied(batch)
        if state.recoveries.followed:
            for recovery in state.recoveries.after_batch(batch):
                self._put_always(recovery)
        payload = batch.payload
        if not self._queue.put_batch(
            (stream, epoch, batch.seq, batch.ts, batch.recv_ts, payload), len(payload)
        ):
            self._note_drop(stream, state, epoch, batch.seq, batch.ts)
        elif state.dropped_from is not None:
            self._close_drop(stream, state)
        if state.pacer.counted(events) and state.dropped_from is None:
            self._checkpoint(batch, state)


def _rows(kind: type[StoreWriter], queue_rows: int) -> list[str]:
    settings = StoreSettings(
        queue_rows=queue_rows, checkpoint_every_batches=31, spill_bytes=0, recovery_offsets_s=(1, 5)
    )
    writer = kind(open_store("sqlite://"), settings)
    streams = [StreamId("turns", rank) for rank in range(3)]
    ingests = {s: StreamIngest(s, can_replay=False, sink=writer) for s in streams}
    rng = random.Random(20261205)
    cached: dict[StreamId, list[int]] = {s: [] for s in streams}
    seqs = dict.fromkeys(streams, 0)
    ts, now = 1_796_051_000.0, 1_796_051_000.5
    taken: list[Any] = []
    for turn in range(3000):
        stream = streams[0] if rng.random() < 0.5 else rng.choice(streams)
        ts += rng.choice((0.0, 0.01, 0.02, 0.3))
        now += 0.02
        seqs[stream] += 1
        if rng.random() < 0.003:
            seqs[stream] = 0  # a restart
        if turn % 700 == 350:
            # Its lease lost and taken again: its state starts anew, as on a new holder.
            writer.forget(stream)
            ingests[stream] = StreamIngest(stream, can_replay=False, sink=writer)
            cached[stream] = []
        body = payload(*_events(rng, cached[stream]), ts=ts)
        ingests[stream].live_frames(frames(seqs[stream], body), now)
        if turn % 500 == 499:
            queue = writer._queue  # its rows written: room again, drops end
            queue.linger_s = 0.0
            taken += queue.take(len(queue._rows)) or []
            queue.done(queue._droppable_in - queue._droppable_out)
    writer.close(5)
    return _canonical(taken + list(writer._queue._rows))


@pytest.mark.parametrize("queue_rows", [1_000_000, 300])
def test_streams_in_turns_queue_what_the_python_sink_queued(
    queue_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    c_rows = _rows(StoreWriter, queue_rows)
    assert len(c_rows) > 1500
    assert any("incomplete" in r for r in c_rows) == (queue_rows < 1000)
    assert c_rows == _rows(_Python, queue_rows)


def test_an_instant_runs_no_python_frame_of_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a second's end (no recovery followed) the call, its state, the rollup's rows and its
    span are C: the only Python frames are the map's (its stats) and the row's `__init__`."""
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    writer = StoreWriter(open_store("sqlite://"), StoreSettings(spill_bytes=0))
    stream = StreamId("instant", 0)
    ingest = StreamIngest(stream, can_replay=False, sink=writer)
    ingest.live_frames(frames(0, payload(ts=10.5)), 10.6)  # the stream's state made
    view = ingest.map
    called: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            called.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        span = writer.instant(stream, 11.25, view)
    finally:
        sys.setprofile(None)
    assert span == Span(11.0, 12.0)
    assert type(span) is Span and type(span.since) is float
    assert set(called) <= {"stats", "<dictcomp>", "__init__"}, called
    (row,) = [r for r in writer._queue._rows if type(r).__name__ == "RollupRow"]
    assert row.second == 10
