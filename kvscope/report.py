"""`kvscope report`: what resets did, as a PNG and a small HTML page, from the store.

Per reset (several side by side): stored and hittable blocks against seconds since the reset
(per-second rollups, with the recovery points on top), the share of the pre-reset prefixes
cached again (tokens of hittable blocks), and, when the replica's /metrics was scraped, vLLM's
prefix-cache hit rate and TTFT p50 around the reset.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import typer
from matplotlib.figure import Figure
from rich.console import Console
from sqlalchemy import Engine, Row, func, select

from kvscope.options import ConfigOpt, TokenizerOpt, fail, token_text
from kvscope.report_compare import as_json, text_table, write_compare
from kvscope.report_prefixes import load_prefixes, write_prefixes
from kvscope.storage import schema
from kvscope.storage.mode_compare import RowsAfter
from kvscope.storage.redact import redact
from kvscope.storage.reset_links import LINK_WINDOW_S, linked_modes, resets_query
from kvscope.storage.scrape import HitRatePoint, hit_rate_series
from kvscope.storage.token_text import TokenText
from kvscope.store_commands import open_for_reading

BEFORE_S = 30.0
"""Seconds before the reset that the charts show."""
AFTER_S = 300.0


@dataclass
class ResetData:
    id: int
    replica: str
    rank: int
    seq: int
    ts: float
    reason: str
    mode: str | None
    before_blocks: int
    before_hittable: int
    t50_s: float | None
    t90_s: float | None
    points: list[Any] = field(default_factory=list)
    """reset_recovery rows: offset_s, blocks, hittable, orphans, share_*_back."""
    rollups: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds since the reset, stored, hittable) summed over tiers, one per second."""
    engine: list[HitRatePoint] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"#{self.id} {self.replica}" + (f" {self.mode}" if self.mode else "")

    def point(self, offset: float) -> Any | None:
        return next((p for p in self.points if p.offset_s == offset), None)


def reset_ids(engine: Engine, replica: str, from_ts: float, to_ts: float) -> list[int]:
    r, s = schema.resets, schema.streams
    query = (
        select(r.c.id)
        .join(s, s.c.id == r.c.stream_id)
        .where(s.c.replica == replica, r.c.ts >= from_ts, r.c.ts <= to_ts)
        .order_by(r.c.ts)
    )
    with engine.connect() as conn:
        return [int(i) for i in conn.execute(query).scalars()]


def rows_so_far(engine: Engine) -> RowsAfter:
    """Where the next run's resets and reset requests begin in this store."""
    with engine.connect() as conn:
        return RowsAfter(
            int(conn.execute(select(func.max(schema.resets.c.id))).scalar() or 0),
            int(conn.execute(select(func.max(schema.reset_requests.c.id))).scalar() or 0),
        )


def load_resets(engine: Engine, ids: list[int], window: float = LINK_WINDOW_S) -> list[ResetData]:
    """Each reset with its recovery, rollups and scraped engine figures around it; its mode is
    the one GET /resets gives (the store keeps none: it is the linked request's)."""
    r, rr, ro = schema.resets, schema.reset_recovery, schema.rollups
    out = []
    with engine.connect() as conn:
        rows: list[Row[Any]] = []
        for reset_id in ids:
            row = conn.execute(resets_query().where(r.c.id == reset_id)).first()
            if row is None:
                raise KeyError(reset_id)
            rows.append(row)
        modes = linked_modes(conn, rows, window)
        for row in rows:
            data = ResetData(
                row.id,
                row.replica,
                row.rank,
                row.seq,
                row.ts,
                row.reason,
                modes[row.id],
                row.before_blocks,
                row.before_hittable,
                row.t50_s,
                row.t90_s,
            )
            data.points = list(
                conn.execute(select(rr).where(rr.c.reset_id == row.id).order_by(rr.c.offset_s))
            )
            # Up to where the recovery was followed (the next reset ends it).
            end = min(row.ts + AFTER_S, row.recovery_until_ts or row.ts + AFTER_S)
            lo, hi = int(row.ts - BEFORE_S), int(end)
            query = (
                select(ro.c.second, func.sum(ro.c.stored), func.sum(ro.c.hittable))
                .where(ro.c.stream_id == row.stream_id, ro.c.second >= lo, ro.c.second <= hi)
                .group_by(ro.c.second)
                .order_by(ro.c.second)
            )
            # A rollup row is the map after the last batch of its second: plot it at its end.
            data.rollups = [
                (sec + 1 - row.ts, int(st), int(hit)) for sec, st, hit in conn.execute(query)
            ]
            data.engine = hit_rate_series(conn, row.replica, row.ts - BEFORE_S, row.ts + AFTER_S)
            out.append(data)
    return out


def build_figure(resets: list[ResetData]) -> Figure:
    """Blocks, share back and (when scraped) hit rate and TTFT p50, one colour per reset."""
    scraped_points = [p for d in resets for p in d.engine]
    scraped = any(p.hit_rate is not None or p.ttft_p50 is not None for p in scraped_points)
    rows = 4 if scraped else 2
    fig, axes = plt.subplots(rows, 1, figsize=(10, 3.0 * rows), sharex=True, squeeze=False)
    ax = [a[0] for a in axes]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, d in enumerate(resets):
        c = colors[i % len(colors)]
        t = [x for x, _, _ in d.rollups]
        ax[0].plot(t, [st for _, st, _ in d.rollups], color=c, label=f"{d.label} stored")
        ax[0].plot(t, [h for _, _, h in d.rollups], color=c, ls="--", label=f"{d.label} hittable")
        offsets = [p.offset_s for p in d.points]
        ax[0].plot(offsets, [p.blocks for p in d.points], "o", color=c)
        shares = [0.0, *(p.share_tokens_back for p in d.points)]
        ax[1].plot(
            [0.0, *offsets], shares, "o-", color=c, label=f"{d.label} share of prefixes back"
        )
        if scraped:
            hit_t, hit = _known(d, [p.hit_rate for p in d.engine])
            ax[2].plot(hit_t, hit, ".-", color=c, label=f"{d.label} hit rate")
            ttft_t, ttft = _known(d, [p.ttft_p50 for p in d.engine])
            ax[3].plot(ttft_t, ttft, ".-", color=c, label=f"{d.label} TTFT p50")
    titles = [
        "blocks (solid: stored, dashed: hittable)",
        "share of pre-reset prefixes cached again",
        "vLLM prefix-cache hit rate",
        "vLLM TTFT p50 (s)",
    ]
    for a, title in zip(ax, titles, strict=False):
        a.set_title(title, fontsize=10)
        a.axvline(0.0, color="grey", lw=0.8)
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="best")
    ax[1].set_ylim(0, 1.05)
    ax[-1].set_xlabel("seconds since the reset")
    fig.tight_layout()
    return fig


def _known(d: ResetData, values: list[float | None]) -> tuple[list[float], list[float]]:
    """The seconds after the reset and the value of each of `d.engine`'s points where `values`
    (one per point) has one."""
    known = [(p.ts - d.ts, v) for p, v in zip(d.engine, values, strict=True) if v is not None]
    return [t for t, _ in known], [v for _, v in known]


def _cell(value: float | None, unit: str = " s") -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def write_report(
    resets: list[ResetData], out: Path, name: str = "report", extra_html: str = ""
) -> tuple[Path, Path]:
    """`out/NAME.png` and `out/NAME.html` (the page embeds the PNG and a table per reset, then
    `extra_html`)."""
    out.mkdir(parents=True, exist_ok=True)
    png, page = out / f"{name}.png", out / f"{name}.html"
    fig = build_figure(resets)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    head: tuple[str, ...] = ("reset", "replica", "rank", "seq", "reason", "mode")
    head += ("before blocks / hittable", "+1 s", "+10 s", "+60 s", "50 %", "90 %")
    rows = []
    for d in resets:
        after = []
        for offset in (1.0, 10.0, 60.0):
            p = d.point(offset)
            after.append("-" if p is None else f"{p.blocks} / {p.hittable}")
        before = f"{d.before_blocks} / {d.before_hittable}"
        times = (_cell(d.t50_s), _cell(d.t90_s))
        cells = (d.id, d.replica, d.rank, d.seq, d.reason, d.mode or "-", before, *after, *times)
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    page.write_text(
        "<!doctype html><meta charset=utf-8><title>kvscope report</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;"
        "border-bottom:1px solid #ddd}</style><h1>What the resets did</h1><table><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join(rows)
        + f'</table><p><img src="{png.name}" alt="recovery charts"></p>\n'
        + extra_html
    )
    return png, page


def write_with_prefixes(
    engine: Engine, resets: list[ResetData], out: Path, text: TokenText | None = None
) -> tuple[Path, Path]:
    """`write_report` with the resets' prefix groups (`kvscope report`'s and the demo's)."""
    out.mkdir(parents=True, exist_ok=True)
    section = write_prefixes(load_prefixes(engine, [d.id for d in resets]), out, text=text)
    return write_report(resets, out, extra_html=section)


def report(
    store: Annotated[str, typer.Option(envvar="KVSCOPE_STORE", help="SQLAlchemy URL.")],
    out: Annotated[Path, typer.Option(help="Folder for report.png and report.html.")],
    reset: Annotated[str | None, typer.Option(help="ID[,ID...] of resets side by side.")] = None,
    replica: Annotated[str | None, typer.Option(help="Every reset of this replica...")] = None,
    from_: Annotated[float, typer.Option("--from", help="...from this Unix time...")] = 0.0,
    to: Annotated[float, typer.Option(help="...to this one.")] = 1e11,
    compare: Annotated[bool, typer.Option(help="--replica's modes side by side.")] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="With --compare: print it as JSON.")
    ] = False,
    tokenizer: TokenizerOpt = None,
    config_file: ConfigOpt = None,
) -> None:
    """Chart what resets did: blocks, prefixes back, hit rate and TTFT (PNG + HTML)."""
    console = Console()
    text = token_text(tokenizer, config_file)
    engine = open_for_reading(store)
    if compare:
        if replica is None:
            raise fail("--compare needs --replica NAME")
        found, written = write_compare(engine, replica, from_, to, out)
        if json_:
            print(as_json(found))
        else:
            console.print(text_table(found), highlight=False)
            console.print(f"wrote {written}")
        return
    if reset is not None:
        try:
            ids = [int(x) for x in reset.split(",") if x.strip()]
        except ValueError as exc:
            raise fail(f"--reset {reset!r}: expected ID[,ID...]") from exc
    elif replica is not None:
        ids = reset_ids(engine, replica, from_, to)
    else:
        raise fail("give --reset ID[,ID...] or --replica NAME [--from T --to T]")
    if not ids:
        raise fail("no reset in that range")
    try:
        resets = load_resets(engine, ids)
    except KeyError as exc:
        raise fail(f"no reset {exc.args[0]} in {redact(store)}") from exc
    png, page = write_with_prefixes(engine, resets, out, text)
    console.print(f"wrote {png} and {page} ({len(resets)} resets)")
