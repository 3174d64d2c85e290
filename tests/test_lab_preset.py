"""The `keep-reset-study` preset behaves like the server of the published study (issue 13).

The study's server, at 3 req/s: idle (no KV cache block held) 0.8 times a minute, and a
preempting reset restarted about 8 requests; at 4 req/s: never idle in 11 minutes, and a
preempting reset restarted about 21. The preset, run in simulated time after a minute's warm-up
with a preempting reset every 30 s (`kvscope.lab.study`), must give each figure within 30 %.
None of them is a timing: the clock is simulated, the arrivals and the tokens are seeded.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvscope.lab.presets import KEEP_RESET_STUDY, LoadFlags, build_load
from kvscope.lab.study import study_figures

pytestmark = pytest.mark.vllm

TOLERANCE = 0.30


def near(got: float, want: float) -> bool:
    return abs(got - want) <= TOLERANCE * want


def test_at_3_requests_per_second_idle_08_a_minute_and_8_restarted() -> None:
    # Half an hour: the idle count is small, a shorter run would measure mostly its noise.
    figures = study_figures(KEEP_RESET_STUDY, rate=3.0, minutes=30.0)
    assert figures.resets == 59
    assert near(figures.idle_per_minute, 0.8), figures
    assert near(figures.restarted_per_reset, 8.0), figures
    assert figures.kv_full_preemptions == 0, "the running requests should fit the KV cache"


def test_at_4_requests_per_second_never_idle_in_11_minutes_and_21_restarted() -> None:
    figures = study_figures(KEEP_RESET_STUDY, rate=4.0, minutes=11.0)
    assert figures.resets == 21
    assert figures.idle_periods == 0, figures
    assert near(figures.restarted_per_reset, 21.0), figures
    assert figures.kv_full_preemptions == 0, "the running requests should fit the KV cache"


def test_flags_given_with_a_preset_override_it() -> None:
    workload, engine = build_load("keep-reset-study", LoadFlags(rate=4.0, seed=3))
    assert workload == replace(KEEP_RESET_STUDY.workload, rate=4.0, seed=3)
    assert engine == replace(KEEP_RESET_STUDY.engine, topic="kv-events")
    workload, engine = build_load(None, LoadFlags(step_time="0.02,1e-5", out_len="8,8"))
    assert workload.out_len == (8, 8) and workload.rate == 3.0
    assert (engine.step_base_s, engine.step_per_token_s, engine.step_per_seq_s) == (0.02, 1e-5, 0)
    assert engine.num_blocks == 400 and engine.step_time(10, 2) == 0.02 + 1e-4
    for preset, flags in (("nope", LoadFlags()), (None, LoadFlags(step_time="1,2,3,4"))):
        with pytest.raises(ValueError):
            build_load(preset, flags)
