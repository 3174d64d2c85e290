"""A thread's time as Linux counts it: on a core, ready but waiting for one, and blocked.

On a shared machine a run's wall is mostly other processes' doing: a thread ready to run waits
for a core (the run queue). What is left of its wall past its CPU and that wait, it spent
blocked: for the GIL, a lock, the disk, a sleep. benchmarks/store.py splits each thread's wall
this way (`/proc/self/task/TID/schedstat` and `status`), figures that hold steadier than the wall.
"""

from __future__ import annotations

from typing import NamedTuple


class ThreadClock(NamedTuple):
    """A thread's counts since it started (or, subtracted, between two readings)."""

    cpu: float
    """Seconds on a core."""
    run_queue: float
    """Seconds ready to run, waiting for a core: the machine's other load."""
    waits: int
    """Times it blocked (voluntary context switches): each a wait for the GIL, a lock, the
    disk or a sleep."""

    def __sub__(self, other: object) -> ThreadClock:
        assert isinstance(other, ThreadClock)
        return ThreadClock(
            self.cpu - other.cpu, self.run_queue - other.run_queue, self.waits - other.waits
        )

    def blocked(self, wall: float) -> float:
        """Of `wall` seconds these counts span, those spent blocked."""
        return wall - self.cpu - self.run_queue


def thread_clock(tid: int) -> ThreadClock | None:
    """The counts of this process's thread `tid` (a native id); None where Linux does not keep
    them, or the thread is gone."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            on_core, run_queue = (int(n) for n in f.read().split()[:2])
        with open(f"/proc/self/task/{tid}/status") as f:
            waits = next(
                int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches")
            )
    except (OSError, ValueError, StopIteration):
        return None
    return ThreadClock(on_core / 1e9, run_queue / 1e9, waits)
