"""The demo's table of resets: each as asked for, the clear the API links to it, its recovery.

Which clear a request made is not decided here: it is `kvscope.storage.reset_links`, the rule
behind the API's `GET /resets`, so the table and the API give the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from kvscope.report import ResetData


@dataclass
class Asked:
    """A reset asked for: its `reset_requests` row, and what the replica was doing then."""

    request_id: int
    before: tuple[int, int] | None = None
    """The collector's map when it was asked (blocks, hittable), if known."""
    running: int | None = None
    """Requests running in the engine when it was asked (the engine's own record)."""
    held: int | None = None
    """Blocks those requests held (the null block aside)."""


def _why(a: Asked, request: Any, window: float) -> str:
    """Why a request made no clear, from what was recorded; never guessed."""
    what = f"#{request.id} {request.replica} {request.mode} {request.outcome}"
    if request.outcome == "refused" and a.running is not None:
        return (
            f"{what}: {a.running} requests running, holding {a.held} blocks "
            "(vLLM resets only when no block is held)"
        )
    if request.outcome == "success":
        return f"{what}, but no clear arrived within {window:g} s"
    return f"{what}: {request.detail or 'no detail'}"


def reset_table(
    asked: Sequence[Asked],
    requests: Mapping[int, Any],
    clears: Mapping[int, Sequence[int]],
    by_id: Mapping[int, ResetData],
    window: float,
) -> Table:
    """One row per reset asked for and clear linked to it (`clears`: request id -> reset ids)."""
    table = Table(
        title="what each reset did (blocks/hittable; 50%, 90%: s to that share)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=0,  # the box's blank divider parts the columns: the table fits 80 columns
        caption_justify="left",
    )
    for column in (
        "asked",
        "mode",
        "outcome",
        "clear",
        "before",
        "+1s",
        "+10s",
        "+60s",
        "50%",
        "90%",
    ):
        table.add_column(column, no_wrap=True)
    notes = []
    for a in asked:
        request = requests[a.request_id]
        head = [f"#{request.id} {request.replica}", request.mode, request.outcome]
        linked = [by_id[i] for i in clears.get(a.request_id, ())]
        if not linked:
            before = "-" if a.before is None else f"{a.before[0]}/{a.before[1]}"
            table.add_row(*head, "none", before, *["-"] * 5)
            notes.append(_why(a, request, window))
        for d in linked:
            # The clear's mode as the API gives it; shown only where it is not the request's.
            clear = f"#{d.id}" + ("" if d.mode == request.mode else f" {d.mode}")
            cells = [*head, clear, f"{d.before_blocks}/{d.before_hittable}"]
            for offset in (1.0, 10.0, 60.0):
                p = d.point(offset)
                cells.append("-" if p is None else f"{p.blocks}/{p.hittable}")
            cells += ["-" if t is None else f"{t:.1f}" for t in (d.t50_s, d.t90_s)]
            table.add_row(*cells)
    if notes:
        table.caption = "\n".join(notes)
    return table
