"""`kvscope demo` end to end from the CLI: lab replicas (vLLM) and the bundled capture."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscope.cli import app


def _check(output: str, out: Path, rows: int) -> None:
    assert output.count("the map equals vLLM's BlockPool") == 2, output
    for mode in ("default", "preempt", "keep"):
        assert re.search(rf"lab-[ab]\s+{mode}\s+(success|refused)", output), output
    assert len(re.findall(r"#\d+ lab-[ab]\s+(preempt|keep)\s+success\s+\d+/\d+", output)) == rows
    url = re.search(r"API\s+(http://127\.0\.0\.1:\d+)\s+page\s+(\S+)\s+docs\s+(\S+)", output)
    assert url is not None and url.group(2) == url.group(1) + "/"
    assert url.group(3) == url.group(1) + "/docs"
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "report.png" in page and "preempt" in page and "keep" in page


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
    assert re.search(r"lab-a\s+default\s+refused", result.output)
