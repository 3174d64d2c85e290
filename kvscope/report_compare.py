"""`kvscope report --compare`: the modes side by side (storage/mode_compare.py) as an HTML
table with a PNG of bars (kvscope/report_compare_chart.py) and, with `--json`, the comparison
itself for scripts."""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from pathlib import Path

from sqlalchemy import Engine

from kvscope.report_compare_chart import write_compare_png
from kvscope.storage.mode_compare import ModeComparison, RowsAfter, compare_modes

ROWS = (
    ("refused", "refused"),
    ("preempted", "preempted"),
    ("tokens_recomputed", "tokens recomputed"),
    ("t50_s", "t50 s"),
    ("t90_s", "t90 s"),
    ("share_back_10s", "back at +10 s"),
    ("orphans", "orphans"),
    ("hit_rate_before", "hit rate before"),
    ("hit_rate_after", "hit rate after"),
    ("ttft_p50_before", "TTFT p50 before"),
    ("ttft_p50_after", "TTFT p50 after"),
)


def _cell(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def table_rows(found: ModeComparison) -> list[list[str]]:
    """Figure name, then one cell per mode (medians; refused as refused/resets)."""
    rows = []
    for key, label in ROWS:
        cells = [
            f"{m.refused}/{m.resets}" if key == "refused" else _cell(m.medians[key])
            for m in found.modes
        ]
        rows.append([label, *cells])
    return rows


def text_table(found: ModeComparison) -> str:
    """Fits 80 columns: 18 for the label, 14 per mode (three modes)."""
    head = f"{'':18}" + "".join(f"{m.mode:>14}" for m in found.modes)
    return "\n".join(
        [head] + [f"{r[0]:18}" + "".join(f"{c:>14}" for c in r[1:]) for r in table_rows(found)]
    )


def write_compare(
    engine: Engine,
    replica: str,
    from_: float,
    to: float,
    out: Path,
    after: RowsAfter | None = None,
) -> tuple[ModeComparison, Path]:
    with engine.connect() as conn:
        found = compare_modes(conn, replica, from_, to, after=after)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "compare.html"
    png = write_compare_png(found, out)
    head = "".join(f"<th>{html.escape(m.mode)}</th>" for m in found.modes)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in table_rows(found)
    )
    page.write_text(
        f"<!doctype html><title>modes side by side</title><h1>{html.escape(replica)}: modes side"
        f" by side</h1><table><tr><th></th>{head}</tr>{body}</table>"
        f'<p><img src="{png.name}" alt="the modes side by side"></p>\n'
    )
    return found, page


def as_json(found: ModeComparison) -> str:
    return json.dumps(asdict(found), indent=2)
