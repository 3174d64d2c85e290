"""Settings for the `kvscope` commands: flags over environment variables over a TOML file.

The file lists replicas and collector settings:

    [collector]
    replay_timeout_s = 5.0
    max_message_bytes = 67108864
    silent_after_s = 30.0
    max_blocks_per_stream = 16777216        # a stream's limits (collector/limits.py):
    max_block_size = 16384                  # --max-blocks-per-stream, --max-block-size,
    max_tables_per_stream = 64              # --max-tables-per-stream,
    max_token_bytes_per_stream = 2147483648 # --max-token-bytes-per-stream

    [[replica]]
    name = "a"
    endpoint = "tcp://10.0.0.5:5557"    # "@tcp://..." binds, for a publisher that connects
    replay = "tcp://10.0.0.5:5558"
    dp_ranks = 2
    topic = ""
    metrics = "http://10.0.0.5:8000/metrics"   # optional: vLLM's own metrics, scraped

    [store]                                 # --store, --shard, --spill-bytes, --spill-dir, --lease
    url = "postgresql+psycopg://kvscope@db/kvscope"
    shard = "east"                          # or lease = true: collectors that fail over
    lease_ttl_s = 10.0                      # with lease: --lease-ttl, --lease-renew
    lease_renew_s = 2.0
    spill_bytes = 1073741824
    spill_dir = "/var/lib/kvscope/spill"
    log_dictionary_bytes = 1048576          # per stream (--log-dictionary-bytes); 0: none

    [fleet]                                 # publishers that connect: kvscope/fleet_config.py
    bind = "tcp://0.0.0.0:5557"
    replay_template = "tcp://{ip}:5558"

    [display]                               # serve, api, report, demo: --tokenizer
    tokenizer = "/models/llama/tokenizer.json"

Flags and their environment variables win over the file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvscope.collector.discovery import DiscoveryError, discover
from kvscope.collector.endpoints import StreamEndpoint, replica_streams
from kvscope.collector.engine_kind import ENGINES, Engine
from kvscope.collector.fleet import FleetError, FleetSettings
from kvscope.collector.limits import MAX_MESSAGE_BYTES_CEILING, IngestLimits
from kvscope.collector.subscriber import CollectorSettings
from kvscope.fleet_config import fleet_section
from kvscope.storage.engine import DEFAULT_STORE
from kvscope.storage.leases import LeaseSettings
from kvscope.storage.log_chunks import SETTABLE_FORMATS
from kvscope.storage.redact import has_userinfo, redact
from kvscope.storage.store_settings import StoreSettings


class ConfigError(ValueError):
    """A setting with a value kvscope cannot use; the message names the key and the value."""


@dataclass(frozen=True)
class ReplicaConfig:
    name: str
    endpoint: str
    replay: str | None = None
    dp_ranks: int = 1
    topic: str = ""
    metrics: str | None = None
    """vLLM's /metrics URL: scraped into the store (hit rate, TTFT, preemptions...)."""
    api: str | None = None
    """vLLM's API server URL (for resets); an http(s) `endpoint` is used when this is unset."""
    engine: Engine | None = None
    """"vllm" or "sglang"; unset: told by the stream's batches."""

    @property
    def api_url(self) -> str | None:
        if self.api is not None:
            return self.api
        return self.endpoint if self.endpoint.startswith(("http://", "https://")) else None

    def streams(self) -> list[StreamEndpoint]:
        """Its streams; an http(s) endpoint is vLLM's API server, asked for its event sources."""
        if self.endpoint.startswith(("http://", "https://")):
            try:
                return discover(self.name, self.endpoint)
            except DiscoveryError as exc:  # its text quotes the URL
                raise ConfigError(redact(f"replica {self.name!r}: {exc}")) from exc
        for endpoint in (self.endpoint, self.replay):
            if (
                endpoint is not None
                and endpoint.lstrip("@").startswith("tcp://")
                and has_userinfo(endpoint)
            ):
                raise ConfigError(
                    f"replica {self.name!r}: {redact(endpoint)} has a user or password, which "
                    "ZMQ endpoints cannot carry (tcp://HOST:PORT)"
                )
        streams = replica_streams(self.name, self.endpoint, self.replay, self.dp_ranks, self.topic)
        return [dataclasses.replace(s, engine=self.engine) for s in streams]


SECONDS = "a number of seconds > 0"


@dataclass(frozen=True)
class StoreConfig:
    """Where history goes, and how much of it may wait on local disk while the store is down."""

    url: str = DEFAULT_STORE
    shard: str | None = None
    spill_bytes: int = StoreSettings.spill_bytes
    spill_dir: str | None = None
    log_dictionary_bytes: int = StoreSettings.log_dictionary_bytes
    """Token content each stream keeps to compress its log against (storage/log_dictionary.py);
    a stream costs the writer a few times this: a collector of many streams may want less."""
    checkpoint_delta_share: float = StoreSettings.checkpoint_delta_share
    """> 0: checkpoints as deltas, less disk, slower rebuilds (storage/store_settings.py)."""
    log_chunk_format: int = StoreSettings.log_chunk_format
    """3 or 4: the columnar log, less disk, slower to pack and replay (store_settings.py)."""
    lease: bool = False
    """Share the streams with the other collectors on this PostgreSQL through leases
    (storage/leases.py), taking over those of a collector that died."""
    lease_ttl_s: float = LeaseSettings.ttl_s
    """With `lease`: a collector that has not beaten this long is taken for dead, and its
    streams are taken over."""
    lease_renew_s: float = LeaseSettings.renew_s
    """With `lease`: the heartbeat and lease round's turn; shorter than `lease_ttl_s`, so that
    a collector beats before its membership expires."""

    def __post_init__(self) -> None:
        for key in ("lease_ttl_s", "lease_renew_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"[store] {key} has value {getattr(self, key)!r}, not {SECONDS}")
        if self.lease_renew_s >= self.lease_ttl_s:
            raise ConfigError(
                f"lease_renew_s ({self.lease_renew_s} s) must be shorter than lease_ttl_s "
                f"({self.lease_ttl_s} s) (--lease-renew, --lease-ttl): a collector beats "
                "before its leases expire"
            )

    @property
    def lease_settings(self) -> LeaseSettings:
        return LeaseSettings(ttl_s=self.lease_ttl_s, renew_s=self.lease_renew_s)


@dataclass(frozen=True)
class Config:
    replicas: list[ReplicaConfig] = field(default_factory=list)
    collector: CollectorSettings = field(default_factory=CollectorSettings)
    store: StoreConfig = field(default_factory=StoreConfig)
    fleet: FleetSettings | None = None
    """Publishers that connect to one bound address (collector/fleet.py); None: no fleet."""
    tokenizer: str | None = None
    """A tokenizer.json: token ids shown as text too (storage/token_text.py)."""


def parse_replica_flag(spec: str) -> tuple[str, str]:
    """`NAME=ENDPOINT` from the command line."""
    name, sep, endpoint = spec.partition("=")
    if not sep or not name or not endpoint:
        raise ConfigError(f"--replica {spec!r}: expected NAME=ENDPOINT, e.g. a=tcp://host:5557")
    return name, endpoint


def load_file(path: Path) -> Config:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    try:
        fleet = fleet_section(data["fleet"]) if "fleet" in data else None
    except FleetError as exc:
        raise ConfigError(str(exc)) from exc
    replicas = data.get("replica", [])
    if not isinstance(replicas, list):
        raise ConfigError(f"[[replica]] must be an array of tables, not {replicas!r}")
    return Config(
        replicas=[_replica(entry, i) for i, entry in enumerate(replicas)],
        collector=_collector(_table(data, "collector")),
        store=_store(_table(data, "store")),
        fleet=fleet,
        tokenizer=_display(_table(data, "display")),
    )


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    section = data.get(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"[{name}] must be a table, not {section!r}")
    return section


def _display(section: Any) -> str | None:
    unknown = set(section) - {"tokenizer"}
    if unknown:
        raise ConfigError(f"[display]: unknown keys {sorted(unknown)}")
    path = section.get("tokenizer")
    if path is not None and (not isinstance(path, str) or path == ""):
        raise ConfigError(f"[display] tokenizer has value {path!r}, not a non-empty path")
    return path


def _replica(entry: Any, index: int) -> ReplicaConfig:
    if not isinstance(entry, dict) or "name" not in entry or "endpoint" not in entry:
        raise ConfigError(f"replica #{index + 1}: needs at least name and endpoint")
    known = {f.name for f in fields(ReplicaConfig)}
    unknown = set(entry) - known
    if unknown:
        raise ConfigError(f"replica {entry['name']!r}: unknown keys {sorted(unknown)}")
    if entry.get("engine", "vllm") not in ENGINES:
        raise ConfigError(
            f"replica {entry['name']!r}: engine has value {entry['engine']!r}, not one of {ENGINES}"
        )
    dp = entry.get("dp_ranks", 1)
    if not isinstance(dp, int) or dp < 1:
        raise ConfigError(f"replica {entry['name']!r}: dp_ranks has value {dp!r}, not a count >= 1")
    return ReplicaConfig(**entry)


def _collector(section: Any) -> CollectorSettings:
    limit_keys = {f.name for f in fields(IngestLimits)}
    known = {f.name for f in fields(CollectorSettings)} - {"limits"} | limit_keys
    unknown = set(section) - known
    if unknown:
        raise ConfigError(f"[collector]: unknown keys {sorted(unknown)}")
    limits = {}
    for key, value in section.items():
        if key in limit_keys:
            # bool is an int to Python, not to a reader of the file.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"[collector] {key} has value {value!r}, not a count >= 1")
            limits[key] = value
        elif not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"[collector] {key} has value {value!r}, not a number >= 0")
        elif key == "max_message_bytes" and value > MAX_MESSAGE_BYTES_CEILING:
            raise ConfigError(
                f"[collector] max_message_bytes has value {value!r}, over "
                f"{MAX_MESSAGE_BYTES_CEILING}: the store could not read such a batch back"
            )
    settings = {k: v for k, v in section.items() if k not in limit_keys}
    return CollectorSettings(**settings, limits=IngestLimits(**limits))


def _store(section: Any) -> StoreConfig:
    unknown = set(section) - {f.name for f in fields(StoreConfig)}
    if unknown:
        raise ConfigError(f"[store]: unknown keys {sorted(unknown)}")
    values = dict(section)
    for key, value in section.items():
        if key == "lease":
            valid, expected = isinstance(value, bool), "true or false"
        elif key in ("lease_ttl_s", "lease_renew_s"):
            valid = isinstance(value, int | float) and not isinstance(value, bool)
            expected = SECONDS
            if valid:
                values[key] = float(value)  # > 0: StoreConfig checks it
        elif key == "checkpoint_delta_share":
            valid = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            expected = "a share >= 0 (0: every checkpoint whole)"
            if valid:
                values[key] = float(value)
        elif key == "log_chunk_format":
            valid = value in SETTABLE_FORMATS and not isinstance(value, bool)
            expected = " or ".join(str(f) for f in SETTABLE_FORMATS)
        elif key in ("spill_bytes", "log_dictionary_bytes"):
            # bool is an int to Python, not to a reader of the file.
            valid = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            expected = "a byte count >= 0"
        else:
            valid = isinstance(value, str) and value != ""
            expected = "a non-empty string"
        if not valid:
            raise ConfigError(f"[store] {key} has value {value!r}, not {expected}")
    return StoreConfig(**values)
