"""Simulated time: the clock a replica runs on, and the `time` vLLM's scheduler stamps with.

A replica's time is simulated seconds since it started (`SimClock.t`); `SimClock.ts`, its epoch
plus `t`, is what its batches' `ts` read. At speed > 0 the clock is paced by the monotonic clock
(speed 1: real time); at speed 0 it moves as fast as the engine steps.

vLLM's scheduler stamps each KVEventBatch with `time.time()` read through its own module's
`time`. `install(module)` replaces that module's `time` (and only that) with a stand-in whose
`time()` answers the stamp the calling thread set with `stamping(ts)`, or the real clock when
it set none, so replicas driven on different threads keep their own clocks. No vLLM here: the
engine hands the module in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

_stamp = threading.local()
_real_time = time
_install_lock = threading.Lock()


class _SchedulerTime:
    """Stands in for the `time` module inside one vLLM module."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)

    @staticmethod
    def time() -> float:
        now: float | None = getattr(_stamp, "now", None)
        return _real_time.time() if now is None else now


def install(module: ModuleType) -> None:
    """Make `module.time.time()` answer the calling thread's `stamping` (once per module)."""
    with _install_lock:
        if not isinstance(getattr(module, "time"), _SchedulerTime):  # noqa: B009
            setattr(module, "time", _SchedulerTime())  # noqa: B010 - a module global


@contextmanager
def stamping(ts: float) -> Iterator[None]:
    """Within: `time.time()` in an installed module reads `ts` on this thread."""
    _stamp.now = ts
    try:
        yield
    finally:
        _stamp.now = None


class SimClock:
    """Simulated seconds since `epoch`, paced against the wall clock when `speed` > 0."""

    def __init__(self, speed: float = 0.0) -> None:
        if speed < 0:
            raise ValueError("speed must be >= 0")
        self.speed = speed
        self.epoch = time.time()
        self.t = 0.0
        self._anchor = (time.monotonic(), 0.0)

    @property
    def ts(self) -> float:
        """The simulated wall clock: what a batch published now would be stamped with."""
        return self.epoch + self.t

    def restart(self) -> None:
        """Time 0 is now (after a slow setup, so that the first batches are not in the past)."""
        self.epoch = time.time()
        self.anchor()

    def anchor(self) -> None:
        """Pace from here: the simulated clock and the wall clock agree now."""
        self._anchor = (time.monotonic(), self.t)

    def wall_t(self) -> float:
        """The simulated time the wall clock has reached since the last `anchor`."""
        wall, sim = self._anchor
        return sim + (time.monotonic() - wall) * self.speed

    def advance(self, seconds: float) -> None:
        """A step took `seconds`; at speed > 0, wait until the wall clock has caught up."""
        self.t += seconds
        if self.speed > 0:
            wait = (self.t - self.wall_t()) / self.speed
            if wait > 0:
                time.sleep(wait)

    def idle_until(
        self,
        target: float,
        wake: threading.Event,
        woken: Callable[[], bool],
        stopping: threading.Event,
    ) -> float:
        """Nothing runs until `target`: move there. At speed > 0 that takes wall time, cut short
        when `wake` is set while `woken()` holds (a reset arrived) or `stopping` is set.
        Returns the simulated seconds idled."""
        start = self.t
        if self.speed > 0:
            while not stopping.is_set():
                now = self.wall_t()
                if now >= target:
                    break
                if wake.wait(min((target - now) / self.speed, 0.5)):
                    wake.clear()
                    if woken():
                        target = min(target, self.wall_t())
                        break
            else:
                target = min(target, self.wall_t())
        self.t = max(self.t, target)
        return self.t - start
