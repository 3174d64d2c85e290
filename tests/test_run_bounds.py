"""The log's runs cut in C (storage/_run_bounds.pyx) where Python cut them
(`log_runs._bounds_in_python`): at each stream or epoch change, and before a run would grow past
its batches, bytes or seconds, stamps in order or not."""

from __future__ import annotations

import math
import random

import pytest

from kvscope.storage import log_runs
from kvscope.storage._run_bounds import run_bounds


def _case(seed: int) -> tuple[list[object], list[int], list[float], list[bytes]]:
    rng = random.Random(seed)
    n = rng.randrange(1, 400)
    streams: list[object] = []
    epochs: list[int] = []
    ts: list[float] = []
    payloads: list[bytes] = []
    stream, epoch, now = "a", 0, 1000.0
    for _ in range(n):
        if rng.random() < 0.02:
            stream = rng.choice("abc")
        if rng.random() < 0.02:
            epoch += 1
        # mostly ahead, at times back (a replayed batch), at times a long pause
        now += rng.choice([0.01, 0.2, -0.5, 3.0, 0.0])
        streams.append(stream)
        epochs.append(epoch)
        ts.append(now)
        payloads.append(b"x" * rng.choice([10, 100, 5000, 300_000]))
    return streams, epochs, ts, payloads


@pytest.mark.parametrize("seed", range(60))
def test_cut_where_python_cuts(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_runs, "MAX_CHUNK_BATCHES", random.Random(seed).choice([7, 50, 2000]))
    streams, epochs, ts, payloads = _case(seed)
    expected = log_runs._bounds_in_python(streams, epochs, ts, payloads)
    assert log_runs.bounds(streams, epochs, ts, payloads) == expected
    assert expected[0][0] == 0 and expected[-1][1] == len(ts)


def test_equal_streams_not_the_same_object_are_one_run() -> None:
    streams = [("r", 0), ("r", 0)]  # equal, two tuples
    assert run_bounds([*streams], [0, 0], [1.0, 2.0], [b"", b""], 10, 100, 10.0) == [(0, 2)]


def test_a_nan_stamp_is_left_to_python() -> None:
    ts = [1.0, math.nan, 2.0]
    assert run_bounds(["a"] * 3, [0] * 3, ts, [b""] * 3, 10, 100, 10.0) is None
    expected = log_runs._bounds_in_python(["a"] * 3, [0] * 3, ts, [b""] * 3)
    assert log_runs.bounds(["a"] * 3, [0] * 3, ts, [b""] * 3) == expected


def test_fields_of_other_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="length"):
        run_bounds(["a"], [0, 0], [1.0], [b""], 10, 100, 10.0)
