"""What a lab run did: each reset's record, each replica's summary, their tables (no vLLM)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvscope.lab.workload import ResetMode
from kvscope.tables import TableData


@dataclass
class ResetRecord:
    """One attempted reset, as the captures' sidecars describe it (plus what it cost)."""

    index: int
    mode: ResetMode
    source: str
    """"schedule" (--resets/--reset-every), "http" (POST /reset_prefix_cache) or "api"."""
    requested_sim_t: float | None
    sim_t: float
    ts: float
    step: int
    reset_external: bool
    running_before: int
    waiting_before: int
    published_through_seq_before: int | None
    result: bool
    running_after: int
    waiting_after: int
    preempted: int
    computed_tokens_lost: int
    """Computed tokens of the preempted requests: work thrown away, to be recomputed."""
    running_computed_tokens_before: int
    running_computed_tokens_after: int
    """Of the requests running before (keep: their computed tokens survive the reset)."""
    requests_ever_preempted_before: int
    requests_ever_preempted_after: int
    pending_events_after: int
    held_blocks_before: int
    held_blocks_after: int
    hashed_blocks_before: int
    hashed_blocks_after: int
    snapshots: list[str] = field(default_factory=list)
    cleared_in_seq: int | None = None
    """The batch that carries this reset's AllBlocksCleared (set once it is published)."""

    @property
    def held_blocks_unchanged(self) -> bool:
        return self.held_blocks_before == self.held_blocks_after

    @property
    def idle_before(self) -> bool:
        """No block was held: a default reset would have succeeded here."""
        return self.held_blocks_before == 0

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["mode"] = self.mode.value
        data["held_blocks_unchanged"] = self.held_blocks_unchanged
        if self.cleared_in_seq is None:
            del data["cleared_in_seq"]
        return data


@dataclass
class ReplicaSummary:
    name: str
    sim_s: float
    wall_s: float
    steps: int
    requests_admitted: int
    requests_finished: int
    idle_s: float
    """Simulated seconds with no request in the engine: a default reset would have succeeded."""
    idle_periods: int
    preemptions: int
    """Preemptions by the scheduler itself (KV cache full), not by resets."""
    batches_published: int
    resets: list[ResetRecord]

    @property
    def idle_fraction(self) -> float:
        return self.idle_s / self.sim_s if self.sim_s > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["idle_fraction"] = self.idle_fraction
        data["resets"] = [r.as_json() for r in self.resets]
        return data


@dataclass
class ModeSummary:
    mode: ResetMode
    attempts: int = 0
    succeeded: int = 0
    idle_at_reset: int = 0
    running_before: int = 0
    preempted: int = 0
    computed_tokens_lost: int = 0
    hashed_blocks_dropped: int = 0
    kept_running: int = 0

    @property
    def preempted_per_reset(self) -> float:
        return self.preempted / self.attempts if self.attempts else 0.0


def by_mode(resets: Iterable[ResetRecord]) -> dict[ResetMode, ModeSummary]:
    modes = {mode: ModeSummary(mode) for mode in ResetMode}
    for r in resets:
        m = modes[r.mode]
        m.attempts += 1
        m.succeeded += int(r.result)
        m.idle_at_reset += int(r.idle_before)
        m.running_before += r.running_before
        m.preempted += r.preempted
        m.computed_tokens_lost += r.computed_tokens_lost
        if r.result:
            m.hashed_blocks_dropped += r.hashed_blocks_before
            if r.mode == ResetMode.KEEP:
                m.kept_running += r.running_after
    return {mode: m for mode, m in modes.items() if m.attempts}


def replicas_table(summaries: Sequence[ReplicaSummary]) -> TableData:
    table = TableData(
        "replicas (idle: no block held, a default reset would have succeeded)",
        [
            "replica",
            "sim s",
            "x real",
            "steps",
            "done/admitted",
            "idle",
            "idle periods",
            "KV-full preemptions",
        ],
    )
    for s in summaries:
        speed = s.sim_s / s.wall_s if s.wall_s > 0 else 0.0
        per_min = s.idle_periods / (s.sim_s / 60) if s.sim_s > 0 else 0.0
        record = {k: v for k, v in s.as_json().items() if k != "resets"}
        table.add(
            [
                s.name,
                f"{s.sim_s:.1f}",
                f"{speed:.0f}",
                str(s.steps),
                f"{s.requests_finished}/{s.requests_admitted}",
                f"{100 * s.idle_fraction:.1f} % ({s.idle_s:.1f} s)",
                f"{s.idle_periods} ({per_min:.1f}/min)",
                str(s.preemptions),
            ],
            {**record, "speed_x_real": speed, "idle_periods_per_min": per_min},
        )
    return table


def modes_table(summaries: Sequence[ReplicaSummary]) -> TableData:
    table = TableData(
        "resets by mode (per reset: mean)",
        [
            "mode",
            "ok",
            "idle at reset",
            "running",
            "preempted",
            "tokens thrown away",
            "cached blocks dropped",
            "running kept",
        ],
    )
    modes = by_mode(r for s in summaries for r in s.resets)
    for m in modes.values():
        keep = m.mode == ResetMode.KEEP
        table.add(
            [
                m.mode.value,
                f"{m.succeeded}/{m.attempts}",
                f"{m.idle_at_reset}/{m.attempts}",
                f"{m.running_before / m.attempts:.1f}",
                f"{m.preempted_per_reset:.1f}",
                f"{m.computed_tokens_lost} ({m.computed_tokens_lost / m.attempts:.0f})",
                f"{m.hashed_blocks_dropped}",
                str(m.kept_running) if keep else "-",
            ],
            {**asdict(m), "mode": m.mode.value, "kept_running": m.kept_running if keep else None},
        )
    return table


def resets_table(summaries: Sequence[ReplicaSummary]) -> TableData:
    table = TableData(
        "each reset (before->after)",
        [
            "replica",
            "sim s",
            "mode",
            "via",
            "result",
            "running",
            "preempted",
            "tokens lost",
            "held blocks",
            "cached blocks",
            "clear seq",
        ],
    )
    for s in summaries:
        for r in s.resets:
            table.add(
                [
                    s.name,
                    f"{r.sim_t:.1f}",
                    r.mode.value,
                    r.source,
                    "ok" if r.result else "failed",
                    f"{r.running_before}->{r.running_after}",
                    str(r.preempted),
                    str(r.computed_tokens_lost),
                    f"{r.held_blocks_before}->{r.held_blocks_after}",
                    f"{r.hashed_blocks_before}->{r.hashed_blocks_after}",
                    "-" if r.cleared_in_seq is None else str(r.cleared_in_seq),
                ],
                {"replica": s.name, **r.as_json()},
            )
    return table
