"""`kvscope report --compare`'s PNG: the modes side by side as bars, one group per panel
(t50 and t90, requests preempted, share of prefixes back at +10 s), one bar per mode.

The heights are `compare_bars`' figures: the medians storage/mode_compare.py computed, nothing
recomputed here. A figure no reset of a mode has (refused, not scraped) is drawn as no bar and
labelled "unknown", never as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kvscope.storage.mode_compare import ModeComparison

PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("time back", ("t50_s", "t90_s"), "seconds to 50 % / 90 % of the blocks"),
    ("preempted", ("preempted",), "requests preempted by the reset"),
    ("back at +10 s", ("share_back_10s",), "share of pre-reset prefixes back at +10 s"),
)


@dataclass(frozen=True, slots=True)
class Bar:
    panel: str
    figure: str
    mode: str
    height: float | None


def compare_bars(found: ModeComparison) -> list[Bar]:
    """Every bar of the chart, panel by panel, mode by mode: what the PNG plots."""
    return [
        Bar(panel, key, m.mode, m.medians[key])
        for panel, keys, _ in PANELS
        for key in keys
        for m in found.modes
    ]


def build_compare_figure(found: ModeComparison) -> Figure:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(12, 3.6), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    modes = [m.mode for m in found.modes]
    bars = compare_bars(found)
    for ax, (panel, keys, label) in zip(axes, PANELS, strict=True):
        width = 0.8 / len(keys)
        for k, key in enumerate(keys):
            for i, mode in enumerate(modes):
                (bar,) = [b for b in bars if b.figure == key and b.mode == mode]
                x = i - 0.4 + width * (k + 0.5)
                hatch = "//" if k else None
                color = colors[i % len(colors)]
                height = bar.height or 0.0
                gid = f"{key}:{mode}"
                ax.bar(x, height, width, color=color, hatch=hatch, edgecolor="white", gid=gid)
                shown = "unknown" if bar.height is None else f"{bar.height:.3g}"
                turn = 90 if bar.height is None else 0
                ax.text(x, height, shown, rotation=turn, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(modes)), modes)
        ax.set_title(panel, fontsize=10)
        ax.set_ylabel(label, fontsize=8)
        if len(keys) > 1:
            legend = "plain: t50, hatched: t90"
            ax.text(0.02, 0.98, legend, transform=ax.transAxes, va="top", fontsize=7)
    fig.suptitle(f"{found.replica}: the reset modes side by side (medians)", fontsize=11)
    return fig


def write_compare_png(found: ModeComparison, out: Path) -> Path:
    png = out / "compare.png"
    fig = build_compare_figure(found)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
