"""The `kvscope` command as a user meets it: help, the demo, collect, config errors, the docs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from kvscope.capture_source import CaptureSource
from kvscope.cli import app
from kvscope.collector.capture import read_capture
from kvscope.config import ConfigError, load_file
from kvscope.demo_sources import bundled

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_is_in_the_readme(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert f"kvscope {command}" in README


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_keeps_every_word(command: str) -> None:
    """Help is reflowed to the terminal (no docstring line breaks cut short), and text in
    square brackets is shown, not taken for markup."""
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output
    if command == "demo":
        assert "[default: sqlite in --out, made afresh]" in " ".join(result.output.split())


def test_demo_rebuilds_the_exact_map_through_real_sockets(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert "equals" in result.output
    assert "preempt" in result.output and "keep" in result.output


def test_collect_runs_for_a_while_and_reports_each_stream(tmp_path: Path) -> None:
    records = list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))[:200]
    source = CaptureSource(records)
    source.play()
    config = tmp_path / "kvscope.toml"
    config.write_text(
        f'[collector]\nreplay_timeout_s = 2.0\n\n[[replica]]\nname = "lab"\n'
        f'endpoint = "{source.endpoint}"\nreplay = "{source.replay_endpoint}"\n'
    )
    try:
        store = f"sqlite:///{tmp_path / 'store.sqlite'}"
        result = CliRunner().invoke(
            app,
            ["collect", "--config", str(config), "--duration", "2", "--no-live", "--store", store],
        )
    finally:
        source.close()
    assert result.exit_code == 0, result.output
    assert "lab" in result.output and "199" in result.output
    dumped = CliRunner().invoke(app, ["dump", "--store", store, "--replica", "lab", "--seq", "199"])
    assert dumped.exit_code == 0, dumped.output
    assert dumped.output.count('"hash"') > 100


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[replica]]\nname = 'a'\n", "needs at least name and endpoint"),
        ("[[replica]]\nname = 'a'\nendpoint = 'tcp://x:1'\ndp_ranks = 0\n", "dp_ranks"),
        ("[collector]\nreplay_timeout_s = 'soon'\n", "replay_timeout_s has value 'soon'"),
        ("[collector]\nspeed = 1\n", "unknown keys ['speed']"),
        ("not toml [", "config file"),
        ("display = 3\n", "[display] must be a table, not 3"),
        ("collector = 'fast'\n", "[collector] must be a table, not 'fast'"),
        ("store = 1\n", "[store] must be a table, not 1"),
        ("replica = 'a'\n", "[[replica]] must be an array of tables, not 'a'"),
    ],
)
def test_config_errors_name_the_key_and_the_value(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_file(path)


def test_collect_without_replicas_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["collect", "--duration", "0"])
    assert result.exit_code == 2
    assert "no replica" in result.output
    bad = CliRunner().invoke(app, ["collect", "--replica", "nameonly", "--duration", "0"])
    assert bad.exit_code == 2 and "NAME=ENDPOINT" in bad.output
