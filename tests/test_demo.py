"""`kvscope demo` end to end from the CLI: lab replicas (vLLM) and the bundled capture."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.cli import app
from kvscope.storage.engine import open_store

ROW = re.compile(
    r"#(\d+) (lab-[ab])\s+(default|preempt|keep)\s+(success|refused|http_error|timeout|"
    r"unreachable)\s+(#\d+|none)\s"
)
Link = tuple[str, str, str, int | None]
"""replica, mode, outcome, the clear's id (None: no clear)."""


def _table(output: str) -> dict[int, Link]:
    """The demo's table: request id -> what it says that request made."""
    rows: dict[int, Link] = {}
    for m in ROW.finditer(output):
        assert int(m[1]) not in rows, output
        rows[int(m[1])] = (m[2], m[3], m[4], None if m[5] == "none" else int(m[5][1:]))
    return rows


def _api(out: Path) -> dict[int, Link]:
    """What the API over the demo's store links: request id -> its clear, as GET /resets says."""
    engine = open_store(f"sqlite:///{out / 'demo.sqlite'}")
    try:
        client = TestClient(create_app(ApiData(engine=engine)))
        links: dict[int, Link] = {}
        for reset in client.get("/resets").json():
            request = reset["request"]
            assert client.get(f"/resets/{reset['id']}").json()["request"] == request
            if request is not None:
                assert request["id"] not in links  # one rank: one clear per request
                links[request["id"]] = (
                    reset["replica"],
                    reset["mode"],
                    request["outcome"],
                    reset["id"],
                )
    finally:
        engine.dispose()
    return links


def _check(output: str, out: Path, rows: int) -> None:
    assert output.count("the map equals vLLM's BlockPool") == 2, output
    table = _table(output)
    assert {(replica, mode) for replica, mode, _, _ in table.values()} == {
        (r, m) for r in ("lab-a", "lab-b") for m in ("default", "preempt", "keep")
    }, output
    # Each clear in the table is the one the API links to that request, and no other.
    api = _api(out)
    assert {i: row for i, row in table.items() if row[3] is not None} == api, output
    assert len(api) == rows
    assert (
        len(re.findall(r"#\d+ lab-[ab]\s+(preempt|keep)\s+success\s+#\d+\s+\d+/\d+", output))
        == rows
    )
    # A refused reset says so, and why (the engine's own count when it was asked).
    text = " ".join(output.split())
    for i, (replica, mode, outcome, clear) in table.items():
        if outcome == "refused":
            assert clear is None, output
            assert re.search(rf"#{i} {replica} {mode} refused: \d+ requests running", text), output
    url = re.search(r"API\s+(http://127\.0\.0\.1:\d+)\s+page\s+(\S+)\s+docs\s+(\S+)", output)
    assert url is not None and url.group(2) == url.group(1) + "/"
    assert url.group(3) == url.group(1) + "/docs"
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "report.png" in page and "preempt" in page and "keep" in page
    # What came back, prefix by prefix, and the modes side by side: in the demo's report too.
    assert 'src="report_prefixes.png"' in page and "first tokens" in page
    for replica in ("lab-a", "lab-b"):
        compared = (out / replica / "compare.html").read_text()
        assert "modes side by side" in compared and "keep" in compared
        assert (out / replica / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.vllm
def test_demo_with_lab_replicas_resets_through_the_api(tmp_path: Path) -> None:
    import vllm  # noqa: F401 - the lab needs it; never skipped

    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--source", "lab", "--out", str(out)])
    assert result.exit_code == 0, result.output
    _check(result.output, out, rows=4)
    # Each successful reset went through kvscope's own endpoint and was recorded.
    assert "+60s" in result.output and not re.search(
        r"(preempt|keep)\s+success.*\s-\s", result.output
    )


def test_demo_plays_the_bundled_capture_without_vllm(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app, ["demo", "--out", str(out)], env={"KVSCOPE_DEMO_SOURCE": "capture"}
    )
    assert result.exit_code == 0, result.output
    assert "bundled capture" in result.output
    _check(result.output, out, rows=4)
    # The recording's default reset was refused (requests were running): no clear.
    assert re.search(r"lab-a\s+default\s+refused\s+none", result.output)


def test_demo_json_is_one_document_with_the_tables_records(tmp_path: Path) -> None:
    """`--json`: stdout is one JSON document (progress goes to stderr) with the same resets,
    links and figures as the API, and where the report went."""
    import json

    out = tmp_path / "demo"
    runner = CliRunner()
    result = runner.invoke(
        app, ["demo", "--json", "--out", str(out)], env={"KVSCOPE_DEMO_SOURCE": "capture"}
    )
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["exact"] is True
    rows = found["resets"]["rows"]
    api = _api(out)
    linked = {r["request_id"]: r for r in rows if r["reset_id"] is not None}
    assert {
        i: (r["replica"], r["reset_mode"], r["outcome"], r["reset_id"]) for i, r in linked.items()
    } == api
    for r in linked.values():
        assert r["points"]["1"] is not None and r["t50_s"] is not None
        assert r["before"][0] >= r["before"][1] > 0
    refused = [r for r in rows if r["outcome"] == "refused"]
    assert refused and all(r["reset_id"] is None for r in refused)
    assert len(found["resets"]["notes"]) == len(refused)
    assert Path(found["report"]).name == "report.html"
    assert "the map equals" in result.stderr and "what each reset did" not in result.stderr


def test_a_demo_on_a_reused_store_compares_only_its_own_resets(tmp_path: Path) -> None:
    """With --store naming a store an earlier demo wrote, the modes side by side count this
    run's resets, as the table does, not every run's."""
    store = f"sqlite:///{tmp_path / 'kept.sqlite'}"
    env = {"KVSCOPE_DEMO_SOURCE": "capture"}
    for run in ("first", "second"):
        out = tmp_path / run
        result = CliRunner().invoke(app, ["demo", "--store", store, "--out", str(out)], env=env)
        assert result.exit_code == 0, result.output
        page = (out / "lab-a" / "compare.html").read_text()
        # The recording's default reset, refused once per run.
        assert "<td>refused</td><td>1/1</td>" in page, page
