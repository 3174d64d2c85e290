"""The store's settings from the config file's [store] section, under the environment and flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscope.capture_source import CaptureSource
from kvscope.cli import app
from kvscope.collector.capture import read_capture
from kvscope.config import ConfigError, StoreConfig, load_file
from kvscope.demo_sources import bundled
from kvscope.options import with_lease_flags, with_store_flags
from kvscope.storage.engine import DEFAULT_STORE
from kvscope.storage.leases import LeaseSettings
from kvscope.storage.log_chunks import CHUNK_FORMAT
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.store_settings import StoreSettings
from kvscope.store_commands import open_writer

STORE_SECTION = """
[store]
url = "sqlite:///from-file.sqlite"
shard = "east"
spill_bytes = 4096
spill_dir = "/var/tmp/kvscope"
"""


def test_the_store_section_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(STORE_SECTION)
    assert load_file(path).store == StoreConfig(
        "sqlite:///from-file.sqlite", "east", 4096, "/var/tmp/kvscope"
    )


def test_without_a_store_section_the_defaults_hold(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[collector]\nreplay_timeout_s = 2.0\n")
    store = load_file(path).store
    assert store.url == DEFAULT_STORE and store.shard is None and store.spill_dir is None
    assert store.spill_bytes == 1 << 30


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[store]\nurl = 3\n", "url has value 3"),
        ("[store]\nspill_bytes = -1\n", "spill_bytes has value -1"),
        ("[store]\nspill_bytes = 'big'\n", "spill_bytes has value 'big'"),
        ("[store]\nspill_bytes = true\n", "spill_bytes has value True"),
        ("[store]\nshard = ''\n", "shard has value ''"),
        ("[store]\npath = 'x'\n", r"unknown keys \['path'\]"),
    ],
)
def test_store_errors_name_the_key_and_the_value(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_file(path)


def test_flags_win_over_the_file_and_unset_flags_keep_it(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(STORE_SECTION)
    config = load_file(path)
    kept = with_store_flags(config, None, None, None, None).store
    assert kept == config.store
    over = with_store_flags(config, "sqlite:///flag.sqlite", "west", 0, "/tmp").store
    assert over == StoreConfig("sqlite:///flag.sqlite", "west", 0, "/tmp")


def _collect(tmp_path: Path, text: str, *flags: str, env: dict[str, str] | None = None) -> str:
    """Runs `kvscope collect` for 2 s on 50 recorded batches; returns its output."""
    source = CaptureSource(list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))[:50])
    source.play()
    config = tmp_path / "kvscope.toml"
    config.write_text(
        text + f'\n[[replica]]\nname = "lab"\nendpoint = "{source.endpoint}"\n'
        f'replay = "{source.replay_endpoint}"\n'
    )
    try:
        args = ["collect", "--config", str(config), "--duration", "2", "--no-live", *flags]
        result = CliRunner().invoke(app, args, env=env)
    finally:
        source.close()
    assert result.exit_code == 0, result.output
    return result.output


def test_collect_writes_the_store_the_file_names(tmp_path: Path) -> None:
    from_file = tmp_path / "from-file.sqlite"
    _collect(tmp_path, f'[store]\nurl = "sqlite:///{from_file}"\nspill_dir = "{tmp_path}"\n')
    dumped = CliRunner().invoke(
        app, ["dump", "--store", f"sqlite:///{from_file}", "--replica", "lab", "--seq", "49"]
    )
    assert dumped.exit_code == 0, dumped.output
    assert '"hash"' in dumped.output


def test_the_environment_and_the_flag_win_over_the_file(tmp_path: Path) -> None:
    from_file, from_env, from_flag = (tmp_path / f"{n}.sqlite" for n in ("file", "env", "flag"))
    section = f'[store]\nurl = "sqlite:///{from_file}"\n'
    _collect(tmp_path, section, env={"KVSCOPE_STORE": f"sqlite:///{from_env}"})
    assert from_env.exists() and not from_file.exists()
    _collect(tmp_path, section, "--store", f"sqlite:///{from_flag}")
    assert from_flag.exists() and not from_file.exists()


def test_lease_from_the_file_the_environment_and_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[store]\nurl = "postgresql+psycopg://db/k"\nlease = true\n')
    config = load_file(path)
    assert config.store.lease is True
    assert with_store_flags(config, None, None, None, None).store.lease is True
    assert with_store_flags(config, None, None, None, None, False).store.lease is False
    path.write_text("[store]\nlease = 'yes'\n")
    with pytest.raises(ConfigError, match="lease has value 'yes', not true or false"):
        load_file(path)


def test_lease_timing_from_the_file_under_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[store]\nlease = true\nlease_ttl_s = 30.0\nlease_renew_s = 5\n")
    config = load_file(path)
    assert config.store.lease_settings == LeaseSettings(ttl_s=30.0, renew_s=5.0)
    assert with_store_flags(config, None, None, None, None).store == config.store
    assert with_lease_flags(config, None, None).store == config.store
    flagged = with_lease_flags(config, 20.0, 1.0)
    assert flagged.store.lease_settings == LeaseSettings(ttl_s=20.0, renew_s=1.0)
    assert StoreConfig().lease_settings == LeaseSettings()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lease_ttl_s = 0\n", "lease_ttl_s has value 0.0, not a number of seconds > 0"),
        ("lease_renew_s = 'often'\n", "lease_renew_s has value 'often'"),
        ("lease_renew_s = true\n", "lease_renew_s has value True"),
        ("lease_renew_s = 10.0\n", r"lease_renew_s \(10.0 s\) must be shorter than"),
        ("lease_ttl_s = 3\nlease_renew_s = 4\n", r"lease_renew_s \(4.0 s\) must be shorter"),
    ],
)
def test_lease_timing_errors_name_the_keys(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[store]\n" + text)
    with pytest.raises(ConfigError, match=message):
        load_file(path)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lease-renew", "10"], "lease_renew_s (10.0 s) must be shorter than lease_ttl_s"),
        (["--lease-ttl", "1", "--lease-renew", "1"], "must be shorter than lease_ttl_s (1.0 s)"),
        (["--store", "none"], "--lease needs a shared PostgreSQL store"),
        (["--store", "sqlite:///{tmp}/k.sqlite"], "leases need PostgreSQL"),
        (["--store", "sqlite:///{tmp}/k.sqlite", "--shard", "east"], "exclude each other"),
    ],
)
def test_lease_is_refused_where_it_cannot_work(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    args = ["collect", "--replica", "a=tcp://127.0.0.1:9", "--no-live", "--duration", "1"]
    flags = [f.format(tmp=tmp_path) for f in flags]
    result = CliRunner().invoke(app, [*args, *flags], env={"KVSCOPE_LEASE": "1"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_lease_timing_from_the_environment(tmp_path: Path) -> None:
    args = ["collect", "--replica", "a=tcp://127.0.0.1:9", "--no-live", "--duration", "1"]
    env = {"KVSCOPE_LEASE": "1", "KVSCOPE_LEASE_TTL": "4", "KVSCOPE_LEASE_RENEW": "5"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert "lease_renew_s (5.0 s) must be shorter than lease_ttl_s (4.0 s)" in " ".join(
        result.output.split()
    )


def test_a_fleet_can_lower_the_log_dictionary_each_stream_keeps(tmp_path: Path) -> None:
    # Hundreds of streams per collector: each keeps a few times this in memory.
    path = tmp_path / "c.toml"
    path.write_text(
        f"[store]\nurl = 'sqlite:///{tmp_path / 's.sqlite'}'\nlog_dictionary_bytes = 0\n"
    )
    store = load_file(path).store
    assert store.log_dictionary_bytes == 0
    writer = open_writer(store)
    assert writer is not None
    try:
        assert writer.settings.log_dictionary_bytes == 0
    finally:
        writer.close(10)
    assert StoreConfig().log_dictionary_bytes == StoreSettings.log_dictionary_bytes


@pytest.mark.parametrize("value", ["-1", "true", "'1MiB'"])
def test_a_log_dictionary_size_is_a_byte_count(tmp_path: Path, value: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[store]\nlog_dictionary_bytes = {value}\n")
    with pytest.raises(ConfigError, match="log_dictionary_bytes has value"):
        load_file(path)


def test_the_log_dictionary_size_from_the_flag_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[store]\nlog_dictionary_bytes = 4096\n")
    config = load_file(path)
    kept = with_store_flags(config, None, None, None, None).store
    assert kept.log_dictionary_bytes == 4096
    over = with_store_flags(config, None, None, None, None, log_dictionary_bytes=0).store
    assert over.log_dictionary_bytes == 0


def test_collect_takes_the_log_dictionary_size_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    args = ["collect", "--store", url, "--no-live", "--duration", "1"]
    refused = CliRunner().invoke(app, [*args, "--log-dictionary-bytes", "-1"])
    assert refused.exit_code == 2, refused.output
    env = {"KVSCOPE_LOG_DICTIONARY_BYTES": "-1"}
    refused = CliRunner().invoke(app, args, env=env)
    assert refused.exit_code == 2 and "log-dictionary-bytes" in refused.output, refused.output


def test_a_store_can_trade_rebuild_time_for_disk(tmp_path: Path) -> None:
    # Delta checkpoints take less disk and rebuild slower: opt-in. The columnar log is the
    # default (tests/test_log_granules.py); the older formats are settable.
    assert StoreSettings().checkpoint_delta_share == 0.0
    assert StoreSettings().log_chunk_format == 6
    # One default: the writer's packer, the migrations' and the settings' agree.
    assert LogPacker().fmt == CHUNK_FORMAT == StoreSettings().log_chunk_format
    path = tmp_path / "c.toml"
    path.write_text(
        f"[store]\nurl = 'sqlite:///{tmp_path / 's.sqlite'}'\n"
        "checkpoint_delta_share = 1.0\nlog_chunk_format = 3\n"
    )
    store = load_file(path).store
    writer = open_writer(store)
    assert writer is not None
    try:
        assert writer.settings.checkpoint_delta_share == 1.0
        assert writer.settings.log_chunk_format == 3
    finally:
        writer.close(10)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("log_chunk_format = 1", "log_chunk_format has value 1"),
        ("log_chunk_format = '3'", "log_chunk_format has value '3'"),
        ("checkpoint_delta_share = -0.5", "checkpoint_delta_share has value -0.5"),
        ("checkpoint_delta_share = true", "checkpoint_delta_share has value True"),
    ],
)
def test_disk_trades_are_checked(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[store]\n{line}\n")
    with pytest.raises(ConfigError, match=message):
        load_file(path)
