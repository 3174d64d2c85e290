"""A `LiveSink` (collector/_live_sink.pyx) is told of each batch in C, its changes counted
into a `BatchChanges`: what it reads of each batch is what any sink is handed, changes
included, in the same order (two tiers, clears within batches, gaps, a restart)."""

from __future__ import annotations

import random
from typing import Any

from kvscope.collector._live_sink import LiveSink
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, NullSink
from kvscope.collector.types import StreamId
from tests.test_ingest import frames, payload
from tests.test_store_sink_rows import _events

STREAM = StreamId("live", 0)


def _told(sink: Any) -> list[tuple[object, ...]]:
    seen: list[tuple[object, ...]] = []

    def applied(batch: AppliedBatch) -> None:
        changes = [(key, list(counts)) for key, counts in batch.changes.items()]
        seen.append((batch.stream, batch.epoch, batch.seq, batch.ts, batch.recv_ts, changes))
        seen.append((batch.payload, batch.gaps, batch.view.totals()))

    sink.applied = applied
    ingest = StreamIngest(STREAM, can_replay=False, sink=sink)
    rng = random.Random(20261205)
    cached: list[int] = []
    seq, ts, now = 0, 1_796_051_000.0, 1_796_051_000.5
    for _ in range(2000):
        ts += rng.choice((0.0, 0.01, 0.3))
        now += 0.02
        seq += 2 if rng.random() < 0.003 else 1
        if rng.random() < 0.002:
            seq = 0
        events = _events(rng, cached) + _events(rng, cached)  # now and then both tiers
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), now)
    return seen


class _Live(LiveSink, NullSink):
    pass


def test_a_live_sink_is_told_what_any_sink_is() -> None:
    live = _told(_Live())
    assert len(live) > 3000
    tables = [told[5] for told in live[::2]]
    assert any(isinstance(t, list) and len(t) > 1 for t in tables)  # (both tiers in one batch)
    assert live == _told(NullSink())
