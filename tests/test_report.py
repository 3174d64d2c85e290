"""`kvscope report` over a store filled from the bundled capture; `kvscope record` round trip."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from typer.testing import CliRunner

from kvscope.capture_source import CaptureSource
from kvscope.cli import app
from kvscope.collector.capture import CaptureRecord, read_capture, write_capture
from kvscope.collector.endpoints import StreamEndpoint, replica_streams
from kvscope.demo_sources import bundled
from kvscope.record import record_streams
from kvscope.report import build_figure, load_resets, reset_ids
from kvscope.storage.engine import open_store
from tests.requests_support import insert_requests

CAPTURE = bundled("lab_3rps_180s.msgpack.gz")
PNG = b"\x89PNG\r\n\x1a\n"


def _store(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    result = CliRunner().invoke(app, ["replay", str(CAPTURE), "--replica", "lab", "--store", store])
    assert result.exit_code == 0, result.output
    return store


def test_report_charts_blocks_and_prefixes_back_per_reset(tmp_path: Path) -> None:
    store = _store(tmp_path)
    engine = open_store(store)
    ids = reset_ids(engine, "lab", 0, 1e11)
    assert len(ids) == 2  # the preempt and keep clears (the default reset was refused)
    resets = load_resets(engine, ids)
    assert all(d.points and d.rollups for d in resets)
    fig = build_figure(resets)
    blocks, shares = fig.axes[:2]
    assert len(fig.axes) == 2  # nothing was scraped from /metrics
    labels = [line.get_label() for line in blocks.get_lines()]
    for d in resets:
        assert f"#{d.id} lab stored" in labels and f"#{d.id} lab hittable" in labels
        assert f"#{d.id} lab share of prefixes back" in [x.get_label() for x in shares.get_lines()]
    stored = next(x for x in blocks.get_lines() if x.get_label() == f"#{ids[0]} lab stored")
    ys = np.asarray(stored.get_ydata(), dtype=float)
    assert ys.max() >= resets[0].before_blocks * 0.9 and ys.min() < resets[0].before_blocks / 2
    plt.close(fig)

    out = tmp_path / "report"
    by_id = CliRunner().invoke(
        app, ["report", "--store", store, "--reset", ",".join(map(str, ids)), "--out", str(out)]
    )
    assert by_id.exit_code == 0, by_id.output
    assert (out / "report.png").read_bytes()[:8] == PNG
    assert "report.png" in (out / "report.html").read_text()
    by_range = CliRunner().invoke(
        app, ["report", "--store", store, "--replica", "lab", "--from", "0", "--out", str(out)]
    )
    assert by_range.exit_code == 0 and "2 resets" in by_range.output
    missing = CliRunner().invoke(app, ["report", "--store", store, "--reset", "99", "--out", "x"])
    assert missing.exit_code == 2


def test_report_labels_each_reset_with_the_mode_of_its_request(tmp_path: Path) -> None:
    """The store keeps no mode with a clear: it is the mode of the request through kvscope the
    clear followed (`storage/reset_links.py`, as GET /resets links them)."""
    store = _store(tmp_path)
    engine = open_store(store)
    insert_requests(engine)
    ids = reset_ids(engine, "lab", 0, 1e11)
    resets = load_resets(engine, ids)
    assert [d.mode for d in resets] == ["preempt", "keep"]  # vLLM refused the default one
    fig = build_figure(resets)
    labels = {line.get_label() for line in fig.axes[0].get_lines()}
    plt.close(fig)
    assert {f"#{ids[0]} lab preempt stored", f"#{ids[1]} lab keep stored"} <= labels
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app, ["report", "--store", store, "--reset", ",".join(map(str, ids)), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert "<td>preempt</td>" in page and "<td>keep</td>" in page
    listed = CliRunner().invoke(app, ["resets", "--store", store, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [row["mode"] for row in json.loads(listed.stdout)["rows"]] == ["preempt", "keep"]


def test_record_then_replay_gives_the_same_stream(tmp_path: Path) -> None:
    records = list(read_capture(CAPTURE))[:400]
    source = CaptureSource(records)
    stop, connected = threading.Event(), threading.Event()
    got: dict[StreamEndpoint, list[CaptureRecord]] = {}
    specs = replica_streams("lab", source.endpoint)
    thread = threading.Thread(target=lambda: got.update(record_streams(specs, stop, 30, connected)))
    thread.start()
    try:
        assert connected.wait(10)
        threading.Event().wait(0.5)  # the SUB's subscription reaches the PUB
        source.play()
        assert source.done.wait(30)
        threading.Event().wait(0.5)
    finally:
        stop.set()
        thread.join(10)
        source.close()
    heard = got[specs[0]]
    assert [(r.topic, r.seq, r.payload) for r in heard] == [
        (r.topic, r.seq, r.payload) for r in records
    ]


def test_record_command_writes_a_capture_that_replay_reads(tmp_path: Path) -> None:
    records = list(read_capture(CAPTURE))[:300]
    source = CaptureSource(records, speed=100.0)
    out = tmp_path / "rec.msgpack.gz"
    threading.Timer(1.0, source.play).start()
    try:
        result = CliRunner().invoke(
            app,
            ["record", "--replica", f"lab={source.endpoint}", "--out", str(out), "--duration", "4"],
        )
    finally:
        source.close()
    assert result.exit_code == 0, result.output
    written = list(read_capture(out))
    assert [r.seq for r in written] == [r.seq for r in records]
    first = tmp_path / "first.msgpack.gz"
    write_capture(first, records)
    replayed = CliRunner().invoke(app, ["replay", str(out), "--replica", "lab"])
    original = CliRunner().invoke(app, ["replay", str(first), "--replica", "lab"])
    assert replayed.exit_code == 0 and "last seq 299" in replayed.output
    assert replayed.output == original.output  # the same map, block for block counted
