"""`kvscope report`'s prefix picture: per reset, its pre-reset prefix groups as one stacked bar,
each group as wide as its tokens and coloured by when it was back (storage/reset_prefixes.py
decides; nothing here recomputes the rule), and for the HTML a table of tokens per status and
the largest groups with their root's first tokens (as text with `--tokenizer`, else as ids).
"""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from sqlalchemy import Engine

from kvscope.storage.history import NotInStore
from kvscope.storage.reset_prefix_types import STATUS_COLORS, STATUSES, ResetPrefixes
from kvscope.storage.reset_prefixes import reset_prefixes
from kvscope.storage.token_text import TokenText

LARGEST = 8
"""Groups per reset listed with their first tokens."""


def load_prefixes(engine: Engine, ids: list[int]) -> list[ResetPrefixes]:
    """The prefix groups of each reset whose log is still stored (others are left out)."""
    out = []
    with engine.connect() as conn:
        for reset_id in ids:
            try:
                out.append(reset_prefixes(conn, reset_id))
            except NotInStore:
                continue
    return out


def tokens_by_status(p: ResetPrefixes) -> dict[str, int]:
    totals = dict.fromkeys(STATUSES, 0)
    for g in p.groups:
        totals[g.status] += g.tokens
    return totals


def build_prefix_figure(prefixes: list[ResetPrefixes]) -> Figure:
    """One horizontal bar per reset: its groups left to right, largest first."""
    fig, ax = plt.subplots(figsize=(10, 0.9 * max(1, len(prefixes)) + 1.6), layout="constrained")
    for row, p in enumerate(prefixes):
        left = 0
        for g in p.groups:
            ax.barh(
                row,
                g.tokens,
                left=left,
                height=0.6,
                color=STATUS_COLORS[g.status],
                edgecolor="white",
                linewidth=0.5,
                gid=f"{p.reset_id}:{g.root}",
            )
            left += g.tokens
    ax.set_yticks(range(len(prefixes)), [f"#{p.reset_id}" for p in prefixes])
    ax.invert_yaxis()
    ax.set_xlabel("tokens cached before the reset (one box per prefix group)")
    ax.set_title("prefix groups before the reset, by when they were back", fontsize=10)
    # Below the axes, so it never hides a box.
    fig.legend(
        handles=[Patch(color=STATUS_COLORS[s], label=s) for s in STATUSES],
        fontsize=7,
        loc="outside lower center",
        ncols=len(STATUSES),
    )
    return fig


def first_tokens(tokens: tuple[int, ...] | None, text: TokenText | None) -> str:
    """A root's first tokens as the report shows them: text with a tokenizer, else ids."""
    if tokens is None:
        return "-"
    return text.text(tokens) if text is not None else " ".join(map(str, tokens))


def _table(head: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return (
        "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + cells
    ) + "</table>"


def write_prefixes(
    prefixes: list[ResetPrefixes],
    out: Path,
    name: str = "report",
    text: TokenText | None = None,
) -> str:
    """`out/NAME_prefixes.png`; returns the HTML section that shows it with its tables."""
    if not prefixes:
        return ""
    png = out / f"{name}_prefixes.png"
    fig = build_prefix_figure(prefixes)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    by_status = []
    largest: list[tuple[object, ...]] = []
    for p in prefixes:
        totals = tokens_by_status(p)
        by_status.append((f"#{p.reset_id}", len(p.groups), *(totals[s] for s in STATUSES)))
        for g in p.groups[:LARGEST]:
            largest.append(
                (f"#{p.reset_id}", g.tokens, g.status, first_tokens(g.first_tokens, text))
            )
    shown = "text" if text is not None else "ids (--tokenizer shows them as text)"
    return (
        "<h2>Prefixes back (tokens)</h2>"
        + _table(("reset", "groups", *STATUSES), by_status)
        + f'<p><img src="{png.name}" alt="prefix groups by status"></p>\n'
        + f"<h2>The largest groups and their first tokens ({html.escape(shown)})</h2>"
        + _table(("reset", "tokens", "status", "first tokens"), largest)
        + "\n"
    )
