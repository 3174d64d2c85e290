"""The driving loop: one engine, its load and its resets, on a simulated clock.

Between steps the loop applies queued resets (from other threads: HTTP), scheduled resets,
periodic ground-truth snapshots and the requests that have arrived; then one engine step, whose
simulated duration is the engine's step-time model. With nothing to run, the clock jumps to the
next arrival (at speed > 0 it waits that long on the wall clock).

    driver.run_for(60)                  # simulated seconds
    driver.reset(ResetMode.PREEMPT)     # between steps, from the driving thread
    driver.start(); driver.submit_reset(ResetMode.KEEP)   # its own thread; any thread asks

One thread drives: the caller's (`step`, `run_for`, `run_until`) or, after `start()`, the
driver's own. Imports vLLM (through `kvscope.lab.engine`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kvscope.lab.clock import SimClock
from kvscope.lab.engine import Engine
from kvscope.lab.http import ResetUnavailable
from kvscope.lab.metrics import ReplicaMetrics
from kvscope.lab.report import ResetRecord
from kvscope.lab.reset_record import ResetWitness
from kvscope.lab.workload import ResetMode, ScheduledReset, Workload

logger = logging.getLogger(__name__)

MAX_IDLE_STEPS = 1000
"""Steps in a row that schedule nothing before the loop gives up (the scheduler is stuck)."""


@dataclass
class _Command:
    mode: ResetMode
    reset_external: bool
    source: str
    future: Future[ResetRecord]


class Driver:
    """Drives one `Engine` with a `Workload` on a `SimClock`. See the module docstring."""

    def __init__(
        self,
        name: str,
        engine: Engine,
        workload: Workload,
        clock: SimClock,
        metrics: ReplicaMetrics,
        resets: Sequence[ScheduledReset] = (),
        snapshot_every: float | None = 30.0,
    ) -> None:
        self.name = name
        self.engine = engine
        self.workload = workload
        self.clock = clock
        self.metrics = metrics
        self.snapshot_every = snapshot_every
        self._schedule = sorted(resets, key=lambda r: r.at)
        self._next_snapshot = snapshot_every if snapshot_every else None
        self.ever_preempted: set[str] = set()
        self.witness = ResetWitness(name, engine, clock, self.snapshot, self.ever_preempted)
        # Counters.
        self.steps = 0
        self.requests_admitted = 0
        self.scheduled_tokens = 0
        self.max_running = 0
        self.preemptions = 0
        """Requests the scheduler preempted for want of KV cache blocks (resets aside)."""
        self.idle_s = 0.0
        self.idle_periods = 0
        """Times the engine went from holding blocks to holding none, after a step."""
        self._idle = True
        self.wall_s = 0.0
        self.snapshots: list[dict[str, Any]] = []
        self._zero_token_steps = 0
        # Threads.
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.run_done = threading.Event()
        """Set when the background run (`start`) has reached its duration."""
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self._closed = False

    # --- state ----------------------------------------------------------------------------------
    @property
    def sim_t(self) -> float:
        return self.clock.t

    @property
    def sim_epoch(self) -> float:
        return self.clock.epoch

    @property
    def ts(self) -> float:
        """The simulated wall clock: what the next batch's `ts` would read."""
        return self.clock.ts

    @property
    def resets(self) -> list[ResetRecord]:
        return self.witness.records

    def snapshot(self, label: str, keep: bool = True) -> dict[str, Any]:
        """The ground truth now, shaped like the captures' sidecar snapshots."""
        engine = self.engine
        counts = engine.truth_counts()
        snap = {
            "label": label,
            "sim_t": round(self.clock.t, 6),
            "ts": self.clock.ts,
            "step": self.steps,
            "published_through_seq": engine.last_seq,
            "pending_events": engine.pending_events,
            "medium": "GPU",
            "num_running": engine.num_running,
            "num_waiting": engine.num_waiting,
            "num_free_blocks": engine.block_pool.get_num_free_blocks(),
            "num_keys": len(counts),
            "num_cached_blocks": sum(counts.values()),
            "hashes": [[h, g, n] for (h, g), n in sorted(counts.items())],
        }
        if keep:
            self.snapshots.append(snap)
        return snap

    # --- driving --------------------------------------------------------------------------------
    def _check_driver(self) -> None:
        if self._closed:
            raise RuntimeError(f"replica {self.name} is closed")
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            raise RuntimeError(
                f"replica {self.name} is driven by its own thread (start()); use submit_reset"
            )

    def step(self) -> bool:
        """One engine step; when idle, first wait (simulated) for the next arrival.

        Pending resets, due scheduled resets and snapshots are applied first. Returns False
        when nothing will ever arrive again (no step ran).
        """
        self._check_driver()
        self.clock.anchor()
        started = time.monotonic()
        try:
            while True:
                self._between_steps()
                if self.engine.scheduler.has_requests():
                    self._engine_step()
                    return True
                target = self._next_wake(None)
                if target is None:
                    return False
                self._idle_until(target)
        finally:
            self.wall_s += time.monotonic() - started

    def run_for(self, seconds: float) -> None:
        """Run `seconds` of simulated time (at the clock's speed)."""
        self.run_until_time(self.clock.t + seconds)

    def run_until_time(self, sim_t: float) -> None:
        self._check_driver()
        self.clock.anchor()
        started = time.monotonic()
        try:
            while not self._stopping.is_set():
                self._between_steps()
                if self.clock.t >= sim_t:
                    break
                if self.engine.scheduler.has_requests():
                    self._engine_step()
                    continue
                target = self._next_wake(sim_t)
                assert target is not None
                self._idle_until(target)
        finally:
            self.wall_s += time.monotonic() - started

    def run_until(self, condition: Callable[[], bool], max_seconds: float = 600.0) -> bool:
        """Step until `condition()` holds (checked between steps) or `max_seconds` passed."""
        self._check_driver()
        deadline = self.clock.t + max_seconds
        while not condition():
            if self.clock.t >= deadline or not self.step():
                return condition()
        return True

    def start(self, duration: float | None = None) -> None:
        """Drive on a thread of its own until `duration` simulated seconds (or close).

        After the duration the replica stays up (HTTP, replay) and still applies resets.
        """
        self._check_driver()
        if self._thread is not None:
            raise RuntimeError(f"replica {self.name} was started already")

        def drive() -> None:
            try:
                if duration is None:
                    while not self._stopping.is_set():
                        self.run_until_time(self.clock.t + 3600.0)
                else:
                    self.run_until_time(duration)
            except BaseException as exc:
                self._thread_error = exc
                logger.exception("replica %s: the engine loop failed", self.name)
            finally:
                self.run_done.set()
            while not self._stopping.is_set():
                self.apply_pending(timeout=0.2)

        self._thread = threading.Thread(target=drive, name=f"lab-{self.name}", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the background run reached its duration; re-raises an error of the loop."""
        done = self.run_done.wait(timeout)
        if self._thread_error is not None:
            raise RuntimeError(f"replica {self.name} failed") from self._thread_error
        return done

    def stop_driving(self, timeout: float = 10.0) -> None:
        """Stop the loop (its thread too) and refuse the resets still queued."""
        self._closed = True
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command.future.set_running_or_notify_cancel():
                command.future.set_exception(ResetUnavailable(f"replica {self.name} closed"))

    # --- resets ---------------------------------------------------------------------------------
    def reset(
        self, mode: ResetMode | str = ResetMode.DEFAULT, reset_external: bool = False
    ) -> ResetRecord:
        """Reset now, between steps (from the driving thread, or any thread when none drives)."""
        self._check_driver()
        return self.witness.reset(ResetMode(mode), reset_external, "api", None, self.steps)

    def submit_reset(
        self,
        mode: ResetMode | str = ResetMode.DEFAULT,
        reset_external: bool = False,
        source: str = "api",
    ) -> Future[ResetRecord]:
        """Queue a reset for the driving thread (any thread may call this)."""
        future: Future[ResetRecord] = Future()
        if self._closed:
            future.set_exception(ResetUnavailable(f"replica {self.name} is closed"))
            return future
        self._commands.put(_Command(ResetMode(mode), reset_external, source, future))
        self._wake.set()
        return future

    def apply_pending(self, timeout: float = 0.0) -> int:
        """Apply queued resets (waiting up to `timeout` s for the first); returns how many.

        For a caller that drives the replica itself and wants HTTP resets applied while it
        does not step (they are otherwise applied at the next step).
        """
        self._check_driver()
        try:
            first = self._commands.get(timeout=timeout) if timeout > 0 else None
        except queue.Empty:
            return 0
        return self._apply_commands(first)

    def _apply_commands(self, first: _Command | None = None) -> int:
        applied = 0
        while True:
            if first is not None:
                command, first = first, None
            else:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    return applied
            if not command.future.set_running_or_notify_cancel():
                continue
            try:
                record = self.witness.reset(
                    command.mode, command.reset_external, command.source, None, self.steps
                )
            except BaseException as exc:
                command.future.set_exception(exc)
                raise
            command.future.set_result(record)
            applied += 1

    # --- the loop -------------------------------------------------------------------------------
    def _between_steps(self) -> None:
        self._apply_commands()
        while self._schedule and self._schedule[0].at <= self.clock.t:
            planned = self._schedule.pop(0)
            self.witness.reset(planned.mode, False, "schedule", planned.at, self.steps)
        if self._next_snapshot is not None and self.clock.t >= self._next_snapshot:
            self.snapshot(f"periodic-{self._next_snapshot:g}s")
            assert self.snapshot_every is not None
            while self._next_snapshot <= self.clock.t:
                self._next_snapshot += self.snapshot_every
        for spec in self.workload.due(self.clock.t):
            arrival_ts = self.clock.epoch + spec.arrival
            self.engine.add_request(
                spec.request_id, spec.prompt, spec.max_tokens, arrival_ts, spec.greedy
            )
            self.metrics.add_request(spec.request_id, arrival_ts, len(spec.prompt), spec.max_tokens)
            self.requests_admitted += 1

    def _next_wake(self, end: float | None) -> float | None:
        """The next simulated instant something happens while idle; None: nothing ever will
        (no more arrivals or scheduled resets, and no end to run to)."""
        arrival = self.workload.next_arrival()
        reset = self._schedule[0].at if self._schedule else None
        if arrival is None and reset is None and end is None:
            return None
        times = [t for t in (arrival, reset, end, self._next_snapshot) if t is not None]
        return max(min(times), self.clock.t)

    def _idle_until(self, target: float) -> None:
        """No request in the engine: the clock moves to `target`, or to when a reset arrives."""
        self.idle_s += self.clock.idle_until(
            target, self._wake, lambda: not self._commands.empty(), self._stopping
        )

    def _engine_step(self) -> None:
        engine = self.engine
        step_start_ts = self.clock.ts
        step = engine.schedule()
        self.preemptions += len(step.kv_full_preempted)
        self.ever_preempted.update(step.preempted)
        self.scheduled_tokens += step.tokens
        self.max_running = max(self.max_running, engine.num_running)
        if step.tokens == 0:
            self._zero_token_steps += 1
            if self._zero_token_steps > MAX_IDLE_STEPS:
                raise RuntimeError(f"replica {self.name}: the scheduler makes no progress")
        else:
            self._zero_token_steps = 0
        self.clock.advance(engine.settings.step_time(step.tokens, step.requests))
        now_ts = self.clock.ts
        result = engine.finish_step(step, now_ts)
        self.steps += 1
        self.metrics.record_step(result.scheduler_stats, result.outputs, now_ts, step_start_ts)
        self.witness.after_step()
        # Idle as a default reset sees it: no block held.
        idle = engine.held_blocks == 0
        if idle and not self._idle:
            self.idle_periods += 1
        self._idle = idle
