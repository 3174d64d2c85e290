"""`kvscope report --compare`'s PNG (kvscope/report_compare_chart.py) over a real
`kvscope demo --source lab` run: written, shown on compare.html, and every bar is the median
storage/mode_compare.py computed."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import Rectangle
from sqlalchemy import Engine
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.report_compare_chart import PANELS, build_compare_figure, compare_bars
from kvscope.storage.mode_compare import compare_modes
from tests.test_report import PNG


@pytest.fixture(scope="module")
def store(lab_demo_store: Engine) -> Engine:
    return lab_demo_store


def test_report_compare_writes_the_png(store: Engine, tmp_path: Path) -> None:
    args = ["report", "--store", str(store.url), "--out", str(tmp_path), "--replica", "lab-a"]
    result = CliRunner().invoke(app, [*args, "--compare"])
    assert result.exit_code == 0, result.output
    png = tmp_path / "compare.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
    assert 'src="compare.png"' in (tmp_path / "compare.html").read_text()


def test_every_bar_is_mode_compares_median(store: Engine) -> None:
    with store.connect() as conn:
        found = compare_modes(conn, "lab-a")
    modes = {m.mode: m for m in found.modes}
    assert list(modes) == ["default", "preempt", "keep"]
    bars = compare_bars(found)
    keys = [key for _, panel_keys, _ in PANELS for key in panel_keys]
    assert keys == ["t50_s", "t90_s", "preempted", "share_back_10s"]
    assert [(b.figure, b.mode) for b in bars] == [(k, m) for k in keys for m in modes]
    for b in bars:
        assert b.height == modes[b.mode].medians[b.figure]
    # The default reset is refused in the lab: no figure, so no bar; preempt preempts.
    assert all(b.height is None for b in bars if b.mode == "default")
    (preempt,) = [b for b in bars if (b.figure, b.mode) == ("preempted", "preempt")]
    assert preempt.height is not None and preempt.height > 0

    fig = build_compare_figure(found)
    drawn = {
        p.get_gid(): p.get_height()
        for ax in fig.axes
        for p in ax.patches
        if isinstance(p, Rectangle) and p.get_gid()
    }
    assert drawn == {f"{b.figure}:{b.mode}": b.height or 0.0 for b in bars}
    labels = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_position()[1] >= 0]
    assert labels.count("unknown") == sum(b.height is None for b in bars)
    assert f"{preempt.height:.3g}" in labels
    plt.close(fig)
