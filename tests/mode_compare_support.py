"""A real `kvscope demo --source lab` run into SQLite (vLLM's own scheduler on CPU, one reset of
each mode per replica under the same load), shared by the mode-comparison tests."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.storage.engine import open_store

REPLICAS = ("lab-a", "lab-b")


def demo_lab_store(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    import vllm  # noqa: F401 - the lab needs it; never skipped

    out = tmp_path_factory.mktemp("modes") / "demo"
    result = CliRunner().invoke(app, ["demo", "--source", "lab", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return open_store(f"sqlite:///{out / 'demo.sqlite'}")
