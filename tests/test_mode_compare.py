"""The modes side by side (storage/mode_compare.py) over a real `kvscope demo --source lab`
run: vLLM's own scheduler on CPU, one reset of each mode per replica under the same load. Each
figure is checked against the raw rows it comes from (engine_samples, reset_recovery,
reset_requests), computed here another way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.collector.snapshot import decode_tables
from kvscope.storage import batch_log, schema
from kvscope.storage.mode_compare import SCRAPE_WINDOW_S, ModeComparison, compare_modes
from tests.mode_compare_support import REPLICAS


@pytest.fixture(scope="module")
def store(lab_demo_store: Engine) -> Engine:
    return lab_demo_store


def _compare(store: Engine, replica: str) -> ModeComparison:
    with store.connect() as conn:
        return compare_modes(conn, replica)


def _samples(store: Engine, replica: str) -> list[Any]:
    t = schema.engine_samples
    with store.connect() as conn:
        return list(conn.execute(select(t).where(t.c.replica == replica).order_by(t.c.ts)))


@pytest.mark.parametrize("replica", REPLICAS)
def test_default_is_refused_preempt_preempts_keep_orphans(store: Engine, replica: str) -> None:
    compared = _compare(store, replica)
    modes = {m.mode: m for m in compared.modes}
    assert list(modes) == ["default", "preempt", "keep"]
    t = schema.reset_requests
    with store.connect() as conn:
        rows = conn.execute(select(t.c.mode, t.c.outcome).where(t.c.replica == replica))
        outcomes = {row.mode: row.outcome for row in rows}
    # The lab has requests running at every reset: vLLM refuses the default one.
    assert outcomes["default"] == "refused"
    assert modes["default"].refused == modes["default"].resets == 1
    assert all(v is None for v in modes["default"].medians.values())
    assert modes["preempt"].refused == modes["keep"].refused == 0
    preempt, keep = modes["preempt"].medians, modes["keep"].medians
    assert preempt["preempted"] is not None and preempt["preempted"] > 0
    assert keep["preempted"] == 0
    assert keep["orphans"] is not None and keep["orphans"] > 0
    assert preempt["orphans"] == 0


@pytest.mark.parametrize("replica", REPLICAS)
def test_each_figure_matches_the_raw_rows(store: Engine, replica: str) -> None:
    samples = _samples(store, replica)
    r, rec = schema.resets, schema.reset_recovery
    for f in _compare(store, replica).resets:
        if f.refused:
            continue
        with store.connect() as conn:
            reset = conn.execute(select(r).where(r.c.id == f.reset_id)).one()
            last = conn.execute(
                select(rec).where(rec.c.reset_id == f.reset_id).order_by(rec.c.offset_s.desc())
            ).first()
        assert (f.t50_s, f.t90_s) == (reset.t50_s, reset.t90_s)
        # Preemptions: the counter just after the clear minus just before (one engine here).
        before = [s for s in samples if s.ts <= reset.ts][-1]
        after = [s for s in samples if s.ts > reset.ts][0]
        assert f.preempted == after.preemptions - before.preemptions
        # Tokens recomputed: the recovery row's share of pre-reset blocks cached again, in
        # tokens of the `before` map's block size.
        tables, _ = decode_tables(reset.before)
        sizes = {table.block_size for table in tables.values()}
        assert len(sizes) == 1 and last is not None
        blocks_back = round(last.share_blocks_back * reset.before_blocks)
        assert f.tokens_recomputed == blocks_back * sizes.pop()
        # Hit rate over the window: cumulative counters, so last minus first sample in it.
        for rate, lo, hi in (
            (f.hit_rate_before, reset.ts - SCRAPE_WINDOW_S, reset.ts),
            (f.hit_rate_after, reset.ts, reset.ts + SCRAPE_WINDOW_S),
        ):
            window = [s for s in samples if lo <= s.ts <= hi]
            hits = window[-1].prefix_cache_hits - window[0].prefix_cache_hits
            queries = window[-1].prefix_cache_queries - window[0].prefix_cache_queries
            assert rate == pytest.approx(hits / queries)
        assert f.ttft_p50_before is not None and f.ttft_p50_after is not None
        assert f.share_back_10s is not None and 0 <= f.share_back_10s <= 1


def test_the_api_answers_the_same_comparison(store: Engine) -> None:
    from fastapi.testclient import TestClient

    from kvscope.api.app import create_app
    from kvscope.api.data import ApiData

    client = TestClient(create_app(ApiData(engine=store)))
    answer = client.get("/resets/compare", params={"replica": "lab-a"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    compared = _compare(store, "lab-a")
    assert [m["mode"] for m in body["modes"]] == ["default", "preempt", "keep"]
    assert [r["reset_id"] for r in body["resets"]] == [f.reset_id for f in compared.resets]
    assert body["modes"][1]["medians"]["preempted"] == compared.modes[1].medians["preempted"]
    # Nothing in range: no resets, and the documented error shape for a bad bound.
    assert (
        client.get("/resets/compare", params={"replica": "lab-a", "to": 0}).json()["resets"] == []
    )
    bad = client.get("/resets/compare", params={"replica": "lab-a", "from": "x"})
    assert bad.status_code == 422 and "error" in bad.json()
    assert "/resets/compare" in client.get("/openapi.json").json()["paths"]


def test_report_compare_prints_json_and_an_80_column_table(store: Engine, tmp_path: Path) -> None:
    import json

    url = str(store.url)
    args = ["report", "--store", url, "--out", str(tmp_path), "--replica", "lab-a", "--compare"]
    printed = CliRunner().invoke(app, [*args, "--json"])
    assert printed.exit_code == 0, printed.output
    body = json.loads(printed.output)
    compared = _compare(store, "lab-a")
    assert [m["medians"] for m in body["modes"]] == [m.medians for m in compared.modes]
    table = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    assert all(len(line) <= 80 for line in table.output.splitlines())
    assert "refused" in table.output and "1/1" in table.output
    assert "modes side by side" in (tmp_path / "compare.html").read_text()


@pytest.mark.parametrize("replica", REPLICAS)
def test_a_refused_request_is_placed_on_the_engine_clock(store: Engine, replica: str) -> None:
    # The lab's engine clock is simulated: requests (collector clock) and clears (engine
    # clock) differ by more than the whole window below.
    s = schema.streams
    with store.connect() as conn:
        sid = conn.execute(select(s.c.id).where(s.c.replica == replica)).scalar_one()
        batches = [b.batch for b in batch_log.all_batches(conn, sid)]
    (refused,) = [f for f in _compare(store, replica).resets if f.refused]
    with store.connect() as conn:
        t = schema.reset_requests
        requested_at = conn.execute(
            select(t.c.requested_at).where(t.c.id == refused.request_id)
        ).scalar_one()
    # The last batch received at or before the request gives the engine clock's offset then.
    last = max((b for b in batches if b.recv_ts <= requested_at), key=lambda b: b.recv_ts)
    engine_at = requested_at + (last.ts - last.recv_ts)
    assert abs(last.ts - last.recv_ts) > 10  # the two clocks differ here
    assert refused.ts == pytest.approx(engine_at, abs=1e-6)
    # A window on the engine clock around that instant holds it, and no clear.
    with store.connect() as conn:
        around = compare_modes(conn, replica, engine_at - 0.5, engine_at + 0.5)
    assert [f.request_id for f in around.resets] == [refused.request_id]
    assert [m.mode for m in around.modes] == ["default"]


def test_without_a_scrape_preemptions_are_unknown_not_zero(store: Engine) -> None:
    with store.begin() as conn:
        conn.execute(
            schema.engine_samples.delete().where(schema.engine_samples.c.replica == "lab-b")
        )
    # Runs last: the other tests read lab-b's samples.
    compared = _compare(store, "lab-b")
    made = [f for f in compared.resets if not f.refused]
    assert made and all(f.preempted is None and f.hit_rate_before is None for f in made)
    assert all(m.medians["preempted"] is None for m in compared.modes)
