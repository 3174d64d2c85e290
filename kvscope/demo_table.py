"""The demo's table of resets: each as asked for, the clear the API links to it, its recovery.

Which clear a request made is not decided here: it is `kvscope.storage.reset_links`, the rule
behind the API's `GET /resets`, so the table and the API give the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from kvscope.report import ResetData
from kvscope.tables import TableData


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


COLUMNS = ("asked", "mode", "outcome", "clear", "before", "+1s", "+10s", "+60s", "50%", "90%")
OFFSETS = (1.0, 10.0, 60.0)


def reset_table(
    asked: Sequence[Asked],
    requests: Mapping[int, Any],
    clears: Mapping[int, Sequence[int]],
    by_id: Mapping[int, ResetData],
    window: float,
) -> TableData:
    """One row per reset asked for and clear linked to it (`clears`: request id -> reset ids);
    each row's record carries the same figures typed, for `--json`."""
    table = TableData("what each reset did (blocks/hittable; 50%, 90%: s to that share)", COLUMNS)
    for a in asked:
        request = requests[a.request_id]
        head = [f"#{request.id} {request.replica}", request.mode, request.outcome]
        asked_as = {
            "request_id": int(request.id),
            "replica": request.replica,
            "mode": request.mode,
            "outcome": request.outcome,
        }
        linked = [by_id[i] for i in clears.get(a.request_id, ())]
        if not linked:
            before = "-" if a.before is None else f"{a.before[0]}/{a.before[1]}"
            table.add(
                [*head, "none", before, *["-"] * 5],
                {**asked_as, "reset_id": None, "before": a.before and list(a.before)},
            )
            table.notes.append(_why(a, request, window))
        for d in linked:
            # The clear's mode as the API gives it; shown only where it is not the request's.
            clear = f"#{d.id}" + ("" if d.mode == request.mode else f" {d.mode}")
            cells = [*head, clear, f"{d.before_blocks}/{d.before_hittable}"]
            points = {}
            for offset in OFFSETS:
                p = d.point(offset)
                cells.append("-" if p is None else f"{p.blocks}/{p.hittable}")
                points[f"{offset:g}"] = None if p is None else [p.blocks, p.hittable]
            cells += ["-" if t is None else f"{t:.1f}" for t in (d.t50_s, d.t90_s)]
            record = {
                **asked_as,
                "reset_id": d.id,
                "reset_mode": d.mode,
                "before": [d.before_blocks, d.before_hittable],
                "points": points,
                "t50_s": d.t50_s,
                "t90_s": d.t90_s,
            }
            table.add(cells, record)
    return table


def compact_table(table: TableData) -> Table:
    """`table` as the demo prints it: no edges, the columns parted by the header's blank
    divider alone, so it fits 80 columns."""
    shown = Table(
        title=table.title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=0,
        caption_justify="left",
    )
    for column in table.columns:
        shown.add_column(column, no_wrap=True)
    for row in table.rows:
        shown.add_row(*(escape(cell) for cell in row))
    if table.notes:
        shown.caption = escape("\n".join(table.notes))
    return shown
