"""A stream's limits (collector/limits.py) are settings like the others: `[collector]` keys in
the config file, under flags and their environment variables, given to every stream's decoder
and map (and to a map resumed from the store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.limits import DEFAULT_LIMITS, IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ResumePoint
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.config import ConfigError, load_file
from kvscope.limit_options import with_limit_flags
from tests.test_limits import STREAM, frames, stored


def test_the_limits_are_read_from_the_collector_section(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[collector]\nmax_block_size = 64\nmax_blocks_per_stream = 1000\n")
    limits = load_file(path).collector.limits
    assert limits == IngestLimits(max_block_size=64, max_blocks_per_stream=1000)
    assert CollectorSettings().limits == DEFAULT_LIMITS


@pytest.mark.parametrize("value", ["0", "-1", "true", "1.5", "'many'"])
def test_a_limit_is_a_count_of_at_least_one(tmp_path: Path, value: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[collector]\nmax_tables_per_stream = {value}\n")
    with pytest.raises(ConfigError, match="max_tables_per_stream has value"):
        load_file(path)


def test_a_flag_wins_over_the_file_and_an_unset_one_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[collector]\nmax_block_size = 64\nmax_token_bytes_per_stream = 4096\n")
    config = with_limit_flags(load_file(path), None, None, 5, None)
    assert config.collector.limits == IngestLimits(
        max_block_size=64, max_blocks_per_stream=5, max_token_bytes_per_stream=4096
    )


def test_collect_takes_the_limits_from_flags_and_the_environment(tmp_path: Path) -> None:
    help_text = CliRunner().invoke(app, ["collect", "--help"], terminal_width=200).output
    for flag in ("--max-block-size", "--max-tables-per-stream", "--max-blocks-per-stream"):
        assert flag in help_text
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    args = ["collect", "--store", url, "--no-live", "--duration", "1"]
    refused = CliRunner().invoke(app, [*args, "--max-token-bytes-per-stream", "0"])
    assert refused.exit_code == 2, refused.output
    env = {"KVSCOPE_MAX_BLOCKS_PER_STREAM": "0"}
    refused = CliRunner().invoke(app, args, env=env)
    assert refused.exit_code == 2 and "max-blocks-per-stream" in refused.output, refused.output


def test_every_stream_of_a_collector_has_its_limits() -> None:
    limits = IngestLimits(max_block_size=32, max_blocks_per_stream=2)
    collector = Collector([], settings=CollectorSettings(limits=limits))
    ingest = collector._new_ingest(StreamEndpoint(STREAM, "tcp://127.0.0.1:1", False, None))
    assert ingest.map.limits == limits and ingest.decoder.max_block_size == 32
    ingest.live_frames(frames(0, [stored(1, 2)]), 1.0)
    ingest.live_frames(frames(1, [stored(3, parent=2)]), 1.0)
    assert ingest.counters.malformed == {"limit_exceeded": 1}
    assert StreamIngest(STREAM, can_replay=False).map.limits == DEFAULT_LIMITS
    # A map resumed from the store (read back with the defaults) takes the stream's too.
    ingest.resume(ResumePoint(STREAM, PrefixMap(STREAM), 0, 1, frames(1, [])[2]))
    assert ingest.map.limits == limits


def test_a_store_refuses_limits_it_cannot_rebuild_with(tmp_path: Path) -> None:
    # The store's rebuilds (history, resume, reset followers) replay the log under the default
    # limits, which decide what a batch did: a stream collected under others would rebuild to
    # another map. Until the store records each epoch's limits, a store takes the defaults only.
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    args = ["collect", "--replica", "a=tcp://127.0.0.1:1", "--no-live", "--duration", "0.1"]
    refused = CliRunner().invoke(app, [*args, "--store", url, "--max-tables-per-stream", "100"])
    assert refused.exit_code == 2, refused.output
    assert "limits" in refused.output and "store" in refused.output, refused.output
    assert not (tmp_path / "s.sqlite").exists()
    kept = CliRunner().invoke(app, [*args, "--store", "none", "--max-tables-per-stream", "100"])
    assert kept.exit_code == 0, kept.output


def test_a_message_limit_stays_within_what_the_store_can_read_back(tmp_path: Path) -> None:
    # The store packs a batch's columns into frames it reads back up to MAX_FRAME_BYTES (a
    # token plane takes up to 4 bytes per byte of its msgpack): a larger message would be
    # written and never read again.
    from kvscope.collector.limits import MAX_MESSAGE_BYTES_CEILING
    from kvscope.storage.log_columns import MAX_FRAME_BYTES

    assert 4 * MAX_MESSAGE_BYTES_CEILING <= MAX_FRAME_BYTES
    too_large = str(MAX_MESSAGE_BYTES_CEILING + 1)
    args = ["collect", "--replica", "a=tcp://127.0.0.1:1", "--no-live", "--duration", "0.1"]
    refused = CliRunner().invoke(app, [*args, "--max-message-bytes", too_large])
    assert refused.exit_code == 2 and "max-message-bytes" in refused.output, refused.output
    path = tmp_path / "c.toml"
    path.write_text(f"[collector]\nmax_message_bytes = {too_large}\n")
    with pytest.raises(ConfigError, match="max_message_bytes"):
        load_file(path)
