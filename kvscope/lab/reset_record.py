"""Performs an engine's resets and writes down what each did (no vLLM import here).

Each reset gets a `ResetRecord`: the engine before and after (running, waiting, held and
hashed blocks, computed tokens), ground-truth snapshots just before and after, and, once the
batch carrying its AllBlocksCleared is published, that batch's seq and a snapshot right then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvscope.lab.clock import SimClock
from kvscope.lab.report import ResetRecord
from kvscope.lab.workload import ResetMode

if TYPE_CHECKING:
    from kvscope.lab.engine import Engine

logger = logging.getLogger(__name__)

Snapshot = Callable[[str], dict[str, Any]]
"""Takes (and keeps) a ground-truth snapshot under a label."""


class ResetWitness:
    def __init__(
        self,
        name: str,
        engine: Engine,
        clock: SimClock,
        snapshot: Snapshot,
        ever_preempted: set[str],
    ) -> None:
        self.name = name
        self.engine = engine
        self.clock = clock
        self.snapshot = snapshot
        self.ever_preempted = ever_preempted
        """Every request ever preempted (shared with the driving loop, which adds its own)."""
        self.records: list[ResetRecord] = []
        self._awaiting_clear: list[ResetRecord] = []
        self._post_publish: list[ResetRecord] = []
        engine.clear_observers.append(self._cleared)

    def reset(
        self,
        mode: ResetMode,
        reset_external: bool,
        source: str,
        requested: float | None,
        step: int,
    ) -> ResetRecord:
        """Reset the engine now (between steps) and record it."""
        engine = self.engine
        running = engine.running_requests
        computed_before = {r.request_id: r.num_computed_tokens for r in running}
        running_before, waiting_before = len(running), engine.num_waiting
        held_before = engine.held_blocks
        seq_before = engine.last_seq
        ever_before = len(self.ever_preempted)
        index = len(self.records)
        label = f"reset{index}-{mode.value}"
        pre = self.snapshot(f"{label}-pre")
        outcome = engine.reset(mode, reset_external)
        preempted = outcome.preempted
        self.ever_preempted.update(preempted)
        post = self.snapshot(f"{label}-post")
        record = ResetRecord(
            index=index,
            mode=mode,
            source=source,
            requested_sim_t=requested,
            sim_t=round(self.clock.t, 6),
            ts=self.clock.ts,
            step=step,
            reset_external=reset_external,
            running_before=running_before,
            waiting_before=waiting_before,
            published_through_seq_before=seq_before,
            result=outcome.success,
            running_after=engine.num_running,
            waiting_after=engine.num_waiting,
            preempted=len(preempted),
            computed_tokens_lost=sum(computed_before[rid] for rid in preempted),
            running_computed_tokens_before=sum(computed_before.values()),
            running_computed_tokens_after=sum(r.num_computed_tokens for r in running),
            requests_ever_preempted_before=ever_before,
            requests_ever_preempted_after=len(self.ever_preempted),
            pending_events_after=engine.pending_events,
            held_blocks_before=held_before,
            held_blocks_after=engine.held_blocks,
            hashed_blocks_before=int(pre["num_cached_blocks"]),
            hashed_blocks_after=int(post["num_cached_blocks"]),
            snapshots=[f"{label}-pre", f"{label}-post"],
        )
        if outcome.clear_queued:
            self._awaiting_clear.append(record)
        self.records.append(record)
        logger.info(
            "replica %s: %s reset at %.2f s: %s (running %d -> %d, preempted %d)",
            self.name,
            mode.value,
            self.clock.t,
            "success" if record.result else "failed",
            running_before,
            record.running_after,
            record.preempted,
        )
        return record

    def _cleared(self, seq: int) -> None:
        """A batch carrying an AllBlocksCleared was handed to the publisher."""
        if self._awaiting_clear:
            record = self._awaiting_clear.pop(0)
            record.cleared_in_seq = seq
            self._post_publish.append(record)

    def after_step(self) -> None:
        """The step that published the clears is over: the ground truth right after each."""
        for record in self._post_publish:
            label = f"reset{record.index}-{record.mode.value}-post-publish"
            self.snapshot(label)
            record.snapshots.append(label)
        self._post_publish.clear()
