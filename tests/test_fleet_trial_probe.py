"""benchmarks/fleet.py measures the collector the daemon runs: the store's writer is the
collector's sink itself (told of each batch in C), and the lag is read from outside its path.

A wrapper sink around the writer sent every batch down the Python path (an `AppliedBatch`
built, a Python call) and counted the probe's own work as the collector's CPU.
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import _fleet_trial
from fleet import fleet_stream

from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.storage.writer import StoreWriter


def test_a_trial_hands_the_collector_the_writer_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    sinks: list[Any] = []

    class Recorded(Collector):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            sinks.append(kwargs["sink"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_fleet_trial, "Collector", Recorded)
    stream = fleet_stream(2_500, 3, seed=1, reset_every_s=40)
    trial = _fleet_trial.run_trial("sqlite", 2, stream, 1, 1, warmup_s=0.3, duration_s=0.5)
    assert [type(sink) for sink in sinks] == [StoreWriter]
    assert trial.unapplied == trial.store_dropped == trial.degraded == 0
    assert trial.batches_sent > 0
    assert 0 < trial.lag_p50_s <= trial.lag_p99_s <= trial.lag_max_s


class _Ingest:
    def __init__(self, last_seq: int | None) -> None:
        self.last_seq = last_seq


class _Collector:
    def __init__(self, ingests: dict[StreamId, _Ingest]) -> None:
        self.ingests = ingests


def test_a_batch_is_applied_at_the_first_sample_that_shows_it() -> None:
    stream = StreamId("a", 0)
    sampler = _fleet_trial.AppliedSampler(_Collector({stream: _Ingest(4)}))  # type: ignore[arg-type]
    sampler.seen[stream] = (array("d", [10.0, 10.5, 11.0]), array("q", [1, 2, 4]))
    sent = array("d", [9.0, 9.2, 10.1, 10.2, 10.3, 12.0])
    # seq 0 and 1 at 10.0; 2 at 10.5; 3 and 4 at 11.0; seq 5 never shown, so it has no lag.
    assert list(sampler.lags(stream, sent, since=0.0)) == pytest.approx([1.0, 0.8, 0.4, 0.8, 0.7])
    assert list(sampler.lags(stream, sent, since=10.15)) == pytest.approx([0.8, 0.7])
    assert sampler.applied(stream) == 5
    assert sampler.applied(StreamId("b", 0)) == 0
