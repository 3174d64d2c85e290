"""A fleet's settings from the config file's [fleet], under the environment and the flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.collector.fleet import DEFAULT_TOPIC_PATTERN, FleetError, FleetSettings
from kvscope.config import ConfigError, load_file
from kvscope.fleet_config import fleet_with_flags

FLEET_SECTION = """
[fleet]
bind = "tcp://0.0.0.0:5557"
replay_template = "tcp://{ip}:5558"
gone_after_s = 30
max_publishers = 100
"""


def test_the_fleet_section_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(FLEET_SECTION)
    assert load_file(path).fleet == FleetSettings(
        "tcp://0.0.0.0:5557",
        DEFAULT_TOPIC_PATTERN,
        replay_template="tcp://{ip}:5558",
        gone_after_s=30,
        max_publishers=100,
    )
    path.write_text("[collector]\nreplay_timeout_s = 2.0\n")
    assert load_file(path).fleet is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[fleet]\nreplay_template = 'tcp://{ip}:5558'\n", "needs bind"),
        ("[fleet]\nbind = 5557\n", "bind has value 5557"),
        ("[fleet]\nbind = 'tcp://*:1'\ngone_after_s = 0\n", "gone_after_s has value 0"),
        ("[fleet]\nbind = 'tcp://*:1'\nmax_publishers = true\n", "max_publishers has value True"),
        ("[fleet]\nbind = 'tcp://*:1'\ndp_ranks = 0\n", "dp_ranks has value 0"),
        ("[fleet]\nbind = 'tcp://*:1'\ntopic_pattern = '(?P<ip'\n", "topic pattern"),
        ("[fleet]\nbind = 'tcp://*:1'\nreplay_template = 'tcp://{pod}:1'\n", r"\['pod'\]"),
        ("[fleet]\nbind = '0.0.0.0:5557'\n", "expected tcp://HOST:PORT"),
        ("[fleet]\nbind = 'tcp://*:1'\nport = 2\n", r"unknown keys \['port'\]"),
    ],
)
def test_fleet_errors_name_the_key_and_the_value(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_file(path)


def test_flags_win_over_the_file_and_need_a_bind() -> None:
    file = FleetSettings("tcp://0.0.0.0:5557", replay_template="tcp://{ip}:5558")
    assert fleet_with_flags(file, None, None, None, None, None) == file
    over = fleet_with_flags(file, "tcp://0.0.0.0:6000", None, None, None, 5.0)
    assert over == FleetSettings(
        "tcp://0.0.0.0:6000", replay_template="tcp://{ip}:5558", gone_after_s=5.0
    )
    assert fleet_with_flags(None, None, None, None, None, None) is None
    with pytest.raises(FleetError, match="--replay-template needs --bind"):
        fleet_with_flags(None, None, None, None, "tcp://{ip}:5558", None)


def test_collect_refuses_a_template_the_pattern_cannot_fill() -> None:
    result = CliRunner().invoke(
        app,
        ["collect", "--bind", "tcp://127.0.0.1:1", "--replay-template", "tcp://{host}:1"],
        env={"KVSCOPE_STORE": "none"},
    )
    assert result.exit_code == 2, result.output
    assert "replay template" in result.output and "host" in result.output


def test_a_replicas_engine_is_configured_or_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[[replica]]\nname = "s"\nendpoint = "tcp://h:1"\nengine = "sglang"\n')
    (replica,) = load_file(path).replicas
    assert [s.engine for s in replica.streams()] == ["sglang"]
    path.write_text('[[replica]]\nname = "s"\nendpoint = "tcp://h:1"\nengine = "trt"\n')
    with pytest.raises(ConfigError, match="engine has value 'trt'"):
        load_file(path)
