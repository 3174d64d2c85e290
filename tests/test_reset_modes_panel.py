"""The reset explorer's modes side by side (dashboards/reset_modes_panels.py): a real
`kvscope demo --source lab` run stored in the real PostgreSQL, the panel's SQL run there per
replica, and its rows compared with storage/mode_compare.py's figures. Grafana itself cannot run
here: only its $reset_replica substitution is done by hand."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.dashboards.reset_modes_panels import MODES_SQL
from kvscope.storage.engine import make_engine
from kvscope.storage.mode_compare import MEDIAN_FIELDS, compare_modes
from tests.mode_compare_support import REPLICAS

COLUMNS = {
    "preempted": "preempted",
    "tokens recomputed": "tokens_recomputed",
    "t50 (s)": "t50_s",
    "t90 (s)": "t90_s",
    "back at +10 s": "share_back_10s",
    "orphans": "orphans",
    "hit rate before": "hit_rate_before",
    "hit rate after": "hit_rate_after",
    "TTFT p50 before": "ttft_p50_before",
    "TTFT p50 after": "ttft_p50_after",
}
"""The panel's columns -> the figures of storage/mode_compare.py they show."""


def _panel_equals_mode_compare(conn: sa.Connection, replica: str) -> dict[str, Any]:
    """The panel's rows for `replica` checked against compare_modes; its rows by mode."""
    want = compare_modes(conn, replica)
    got = conn.execute(sa.text(MODES_SQL.replace("$reset_replica", replica))).all()
    assert [r.mode for r in got] == [m.mode for m in want.modes] == ["default", "preempt", "keep"]
    for r, m in zip(got, want.modes, strict=True):
        assert (r.resets, r.refused) == (m.resets, m.refused)
        shown = dict(zip(COLUMNS.values(), (r._mapping[c] for c in COLUMNS), strict=True))
        assert set(shown) == set(MEDIAN_FIELDS)  # every figure the page shows
        for key, value in shown.items():
            expected = m.medians[key]
            if expected is None:
                assert value is None, (replica, m.mode, key)
            else:
                assert value == pytest.approx(expected, rel=1e-9), (replica, m.mode, key)
    return {r.mode: r._mapping for r in got}


def test_the_modes_panel_returns_mode_compares_figures(pg_url: str, tmp_path: object) -> None:
    import vllm  # noqa: F401 - the lab needs it; never skipped

    out = str(tmp_path) + "/demo"
    result = CliRunner().invoke(app, ["demo", "--source", "lab", "--store", pg_url, "--out", out])
    assert result.exit_code == 0, result.output
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        for replica in REPLICAS:
            by_mode = _panel_equals_mode_compare(conn, replica)
            # The lab's figures are not all empty: the panel shows the study's contrast.
            assert (
                by_mode["preempt"]["preempted"] is not None and by_mode["preempt"]["preempted"] > 0
            )
            assert by_mode["keep"]["orphans"] > 0 and by_mode["preempt"]["orphans"] == 0
            assert by_mode["keep"]["tokens recomputed"] > 0
            for column in (
                "hit rate before",
                "hit rate after",
                "TTFT p50 before",
                "TTFT p50 after",
            ):
                assert by_mode["preempt"][column] is not None, (replica, column)
    # An engine that exposes the TTFT histogram but no prefix-cache counters: the panel still
    # shows TTFT, as compare_modes does (each figure from its own samples). Rolled back after.
    with engine.connect() as conn:
        conn.execute(
            sa.text(
                "UPDATE engine_samples SET prefix_cache_queries = NULL, prefix_cache_hits = NULL"
            )
        )
        for replica in REPLICAS:
            by_mode = _panel_equals_mode_compare(conn, replica)
            assert by_mode["preempt"]["hit rate before"] is None
            assert by_mode["preempt"]["TTFT p50 before"] is not None, replica
        conn.rollback()
    engine.dispose()
