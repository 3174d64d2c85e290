"""How a preset is measured against the figures of the study's server (issue 13).

    figures = study_figures(KEEP_RESET_STUDY, rate=3.0, minutes=20.0)

One replica runs the preset at `rate` in simulated time, as fast as it goes: `warm_up_s` from
an empty engine (not counted: the study's server was warm), then `minutes` with a preempting
reset every `reset_every_s`. Idle, as the issue defines it: the engine went from holding KV
cache blocks to holding none (a default reset would have succeeded), seen after each step.
Restarted by a preempting reset: the requests running when it came (all preempted; they start
over). Imports vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvscope.lab.presets import Preset
from kvscope.lab.replica import LabReplica
from kvscope.lab.workload import ResetMode, ScheduledReset


@dataclass(frozen=True)
class StudyFigures:
    rate: float
    minutes: float
    idle_periods: int
    """Times the engine went idle (no block held) during the measured minutes."""
    resets: int
    restarted_per_reset: float
    """Requests a preempting reset preempted, on average."""
    kv_full_preemptions: int
    """Requests the scheduler preempted for want of blocks (none: the KV cache is big enough)."""

    @property
    def idle_per_minute(self) -> float:
        return self.idle_periods / self.minutes


def study_figures(
    preset: Preset,
    rate: float,
    minutes: float,
    seed: int | None = None,
    reset_every_s: float = 30.0,
    warm_up_s: float = 60.0,
) -> StudyFigures:
    workload = replace(preset.workload, rate=rate)
    if seed is not None:
        workload = replace(workload, seed=seed)
    end = warm_up_s + 60.0 * minutes
    count = math.ceil(60.0 * minutes / reset_every_s) - 1
    resets = [
        ScheduledReset(warm_up_s + reset_every_s * k, ResetMode.PREEMPT)
        for k in range(1, count + 1)
    ]
    with LabReplica(
        "study",
        workload,
        preset.engine,
        replay_port=None,
        http_port=None,
        resets=resets,
        snapshot_every=None,
        preset=preset.name,
    ) as replica:
        replica.run_for(warm_up_s)
        idle_before, kv_full_before = replica.idle_periods, replica.preemptions
        replica.run_until_time(end)
        restarted = [r.preempted for r in replica.resets]
        return StudyFigures(
            rate=rate,
            minutes=minutes,
            idle_periods=replica.idle_periods - idle_before,
            resets=len(restarted),
            restarted_per_reset=sum(restarted) / len(restarted) if restarted else 0.0,
            kv_full_preemptions=replica.preemptions - kv_full_before,
        )
