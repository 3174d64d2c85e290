"""`kvscope report`'s prefix picture (kvscope/report_prefixes.py), from a real replay of the
bundled lab capture into SQLite: every box is a group storage/reset_prefixes.py computed."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.report import reset_ids
from kvscope.report_prefixes import build_prefix_figure, load_prefixes
from kvscope.storage.engine import open_store
from kvscope.storage.reset_prefix_types import STATUS_COLORS, STATUSES
from kvscope.storage.reset_prefixes import reset_prefixes
from tests.test_report import PNG, _store


def test_prefix_picture_has_one_box_per_group_sized_and_coloured_by_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    engine = open_store(store)
    ids = reset_ids(engine, "lab", 0, 1e11)
    prefixes = load_prefixes(engine, ids)
    assert [p.reset_id for p in prefixes] == ids
    with engine.connect() as conn:
        expected = {i: reset_prefixes(conn, i) for i in ids}
    assert all(expected[i].groups for i in ids)
    fig = build_prefix_figure(prefixes)
    boxes = [b for b in fig.axes[0].patches if isinstance(b, Rectangle) and b.get_gid()]
    for row, reset_id in enumerate(ids):
        mine = [b for b in boxes if b.get_gid().startswith(f"{reset_id}:")]  # type: ignore[union-attr]
        groups = expected[reset_id].groups
        assert [b.get_gid() for b in mine] == [f"{reset_id}:{g.root}" for g in groups]
        assert [round(b.get_width()) for b in mine] == [g.tokens for g in groups]
        assert [to_hex(b.get_facecolor()) for b in mine] == [
            STATUS_COLORS[g.status] for g in groups
        ]
        assert all(round(b.get_y() + b.get_height() / 2) == row for b in mine)
    plt.close(fig)


def test_report_writes_the_prefix_picture_and_tokens_per_status(tmp_path: Path) -> None:
    store = _store(tmp_path)
    engine = open_store(store)
    ids = reset_ids(engine, "lab", 0, 1e11)
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app, ["report", "--store", store, "--reset", ",".join(map(str, ids)), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert (out / "report_prefixes.png").read_bytes()[:8] == PNG
    page = (out / "report.html").read_text()
    assert 'src="report_prefixes.png"' in page
    with engine.connect() as conn:
        for reset_id in ids:
            p = reset_prefixes(conn, reset_id)
            totals = [sum(g.tokens for g in p.groups if g.status == s) for s in STATUSES]
            cells = [str(c) for c in (f"#{reset_id}", len(p.groups), *totals)]
            row = "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
            assert row in page
            assert sum(totals) == sum(g.tokens for g in p.groups) > 0
    assert re.search(r"<th>not back</th>", page)
