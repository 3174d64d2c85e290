"""The lab's workload and its schedules."""

from __future__ import annotations

import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
from kvscope.lab.replica import LabReplica
from kvscope.lab.workload import (
    ResetMode,
    ScheduledReset,
    Workload,
    WorkloadSpec,
    parse_range,
    parse_resets,
    periodic_resets,
)

pytestmark = pytest.mark.vllm

SYNC_TIMEOUT_S = 10.0
BLOCK = 16


def test_workload_and_schedules() -> None:
    spec = WorkloadSpec(rate=10.0, seed=7, duration=30.0)
    a, b = Workload(spec), Workload(spec)
    first = list(a.due(30.0))
    assert [(r.arrival, r.prompt, r.max_tokens) for r in first] == [
        (r.arrival, r.prompt, r.max_tokens) for r in b.due(30.0)
    ]
    assert 200 < len(first) < 400 and a.next_arrival() is None  # ~10/s for 30 s, then none
    popularity = [sum(r.sys_index == k for r in first) for k in range(spec.num_sys)]
    assert popularity[0] > popularity[-1]  # Zipf-like
    for r in first:
        assert r.prompt[: len(a.system_prompts[r.sys_index])] == a.system_prompts[r.sys_index]
        assert spec.out_len[0] <= r.max_tokens <= spec.out_len[1]
    other = Workload(spec, stream=1)
    assert other.system_prompts == a.system_prompts  # shared prompts, other arrivals
    assert [r.arrival for r in other.due(5.0)] != [r.arrival for r in first if r.arrival <= 5]

    assert parse_resets("90:preempt, 45:default,135:KEEP") == [
        ScheduledReset(45.0, ResetMode.DEFAULT),
        ScheduledReset(90.0, ResetMode.PREEMPT),
        ScheduledReset(135.0, ResetMode.KEEP),
    ]
    assert periodic_resets(60, ResetMode.KEEP, 180) == [
        ScheduledReset(60.0, ResetMode.KEEP),
        ScheduledReset(120.0, ResetMode.KEEP),
    ]
    assert parse_range("32,256") == (32, 256) and parse_range("8") == (8, 8)
    for bad in ("45", "x:keep", "45:never"):
        with pytest.raises(ValueError):
            parse_resets(bad)
    with pytest.raises(ValueError):
        LabReplica("too-small", WorkloadSpec(suffix_len=(32, 4000)))
