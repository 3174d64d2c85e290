"""The demo's table of resets: each as asked for, linked to the clear it made, with its recovery."""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.table import Table

from kvscope.report import ResetData


@dataclass
class Asked:
    """A reset as asked for (lab) or as recorded (capture), and the stored clear it made."""

    replica: str
    mode: str
    outcome: str
    ts: float = 0.0
    seq: int | None = None
    before: tuple[int, int] | None = None
    reset_id: int | None = None


def link_resets(asked: list[Asked], resets: list[ResetData]) -> None:
    """Each successful reset to the clear it made: by seq (capture) or the next clear after."""
    used: set[int] = set()
    for a in asked:
        if a.outcome != "success":
            continue
        match = next(
            (
                d
                for d in resets
                if d.id not in used
                and d.replica == a.replica
                and d.reason == "all_blocks_cleared"
                and (d.seq == a.seq if a.seq is not None else d.ts >= a.ts)
            ),
            None,
        )
        if match is not None:
            used.add(match.id)
            a.reset_id = match.id
            match.mode = a.mode


def reset_table(asked: list[Asked], by_id: dict[int, ResetData]) -> Table:
    table = Table(
        title="what each reset did (blocks/hittable; 50 %, 90 %: s to that share of before)",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    for column in ("reset", "mode", "outcome", "before", "+1s", "+10s", "+60s", "50%", "90%"):
        table.add_column(column, no_wrap=True)
    for a in asked:
        d = by_id.get(a.reset_id) if a.reset_id is not None else None
        before = a.before if d is None else (d.before_blocks, d.before_hittable)
        cells = [a.replica if d is None else f"#{d.id} {a.replica}", a.mode, a.outcome,
                 "-" if before is None else f"{before[0]}/{before[1]}"]  # fmt: skip
        for offset in (1.0, 10.0, 60.0):
            p = None if d is None else d.point(offset)
            cells.append("-" if p is None else f"{p.blocks}/{p.hittable}")
        for t in (None, None) if d is None else (d.t50_s, d.t90_s):
            cells.append("-" if t is None else f"{t:.1f}")
        table.add_row(*cells)
    return table
