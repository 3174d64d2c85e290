"""The command-line options that several commands share, and turning them into a `Config`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kvscope.collector.fleet import FleetError
from kvscope.collector.ingest import DEFAULT_MAX_MESSAGE_BYTES
from kvscope.collector.limits import MAX_MESSAGE_BYTES_CEILING
from kvscope.config import (
    Config,
    ConfigError,
    ReplicaConfig,
    load_file,
    parse_replica_flag,
)
from kvscope.fleet_config import fleet_with_flags
from kvscope.storage.token_text import TokenizerError, TokenText, load_token_text

err = Console(stderr=True)

ReplicaOpt = Annotated[
    list[str],
    typer.Option(
        "--replica",
        "-r",
        envvar="KVSCOPE_REPLICA",
        help="NAME=ENDPOINT of a replica's KV event publisher (repeat for several). "
        "ENDPOINT 'tcp://host:5557' connects; '@tcp://0.0.0.0:5557' binds, for a "
        "publisher configured with a concrete address (which connects); "
        "'http://host:8000' asks vLLM's API server (>= 0.31) for every rank's endpoints.",
    ),
]
ReplayOpt = Annotated[
    list[str],
    typer.Option(help="Replay endpoint (vLLM's replay_endpoint), one per --replica, in order."),
]
MetricsOpt = Annotated[
    list[str],
    typer.Option(help="vLLM's /metrics URL, one per --replica, in order: scraped into the store."),
]
ApiUrlOpt = Annotated[
    list[str],
    typer.Option(
        "--api-url",
        help="vLLM's API server URL, one per --replica, in order: where resets are asked for.",
    ),
]
DpRanksOpt = Annotated[
    list[int],
    typer.Option(help="Data-parallel ranks per replica (ports offset by rank, as vLLM does)."),
]
TopicOpt = Annotated[str, typer.Option(help="Topic prefix to subscribe to.")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", envvar="KVSCOPE_CONFIG", help="TOML config file.")
]
ReplayTimeoutOpt = Annotated[
    float | None, typer.Option(envvar="KVSCOPE_REPLAY_TIMEOUT", help="Seconds.")
]
MaxMessageOpt = Annotated[
    int | None,
    typer.Option(
        envvar="KVSCOPE_MAX_MESSAGE_BYTES",
        min=1,
        max=MAX_MESSAGE_BYTES_CEILING,
        help=f"Larger messages are refused at the socket [default: {DEFAULT_MAX_MESSAGE_BYTES}]",
    ),
]
DurationOpt = Annotated[
    float | None, typer.Option(help="Stop after this many seconds (default: run until ^C).")
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        envvar="KVSCOPE_SHARD",
        help="Name of this collector when several share one store, each with its own "
        "replicas; a replica another shard writes is refused.",
    ),
]
LeaseOpt = Annotated[
    bool | None,
    typer.Option(
        "--lease/--no-lease",
        envvar="KVSCOPE_LEASE",
        help="Share the replicas with every collector on this PostgreSQL through leases: each "
        "holds its share, and takes over those of one that dies. Default: \\[store] lease.",
        show_default=False,
    ),
]
LeaseTtlOpt = Annotated[
    float | None,
    typer.Option(
        envvar="KVSCOPE_LEASE_TTL",
        help="With --lease: seconds without a heartbeat after which a collector is taken for "
        "dead and its streams are taken over. Default: \\[store] lease_ttl_s, else 10.",
        show_default=False,
    ),
]
LeaseRenewOpt = Annotated[
    float | None,
    typer.Option(
        envvar="KVSCOPE_LEASE_RENEW",
        help="With --lease: seconds between heartbeats and lease rounds, shorter than "
        "--lease-ttl. Default: \\[store] lease_renew_s, else 2.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document for scripts instead of tables.")
]
HostOpt = Annotated[str, typer.Option(envvar="KVSCOPE_HOST", help="Address to serve on.")]
PortOpt = Annotated[int, typer.Option(envvar="KVSCOPE_PORT", help="Port to serve on.")]
TokenizerOpt = Annotated[
    Path | None,
    typer.Option(
        envvar="KVSCOPE_TOKENIZER",
        help="A tokenizer.json: prefix groups' first tokens shown as text too (needs the "
        "tokenizers library: pip install 'kvscope[tokenizer]').",
    ),
]
TOKEN_ENV = "KVSCOPE_API_TOKEN"
TokenOpt = Annotated[
    str | None,
    typer.Option(
        envvar=TOKEN_ENV,
        help="Bearer token for mutating endpoints (resets); without one they are disabled.",
    ),
]


def fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(2)


def token_text(flag: Path | None, config_file: Path | None) -> TokenText | None:
    """The tokenizer named by --tokenizer (or KVSCOPE_TOKENIZER), else by the config file's
    `[display] tokenizer`; None when neither names one. One that cannot be loaded: exit 2."""
    try:
        path = flag
        if path is None and config_file is not None:
            named = load_file(config_file).tokenizer
            path = None if named is None else Path(named)
        return load_token_text(path)
    except (ConfigError, TokenizerError) as exc:
        raise fail(str(exc)) from exc


def checked_token(token: str | None) -> str | None:
    """The API token as given; one that is empty or all whitespace is refused (exit 2): no
    Authorization header could carry it, so it would turn on an endpoint nothing can call.
    (Click reads an empty KVSCOPE_API_TOKEN as unset: set but empty is refused too.)"""
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    if token is not None and not token.strip():
        raise fail(
            f"--api-token / {TOKEN_ENV} is empty: give a token, or none to keep resets disabled"
        )
    return token


def load_config(
    config_file: Path | None,
    replicas: list[str],
    replays: list[str],
    dp_ranks: list[int],
    topic: str,
    replay_timeout: float | None,
    max_message_bytes: int | None,
    metrics: list[str] | None = None,
    api_urls: list[str] | None = None,
) -> Config:
    """The file's settings, with the flags' replicas and overrides on top."""
    try:
        config = load_file(config_file) if config_file else Config()
        from_flags = []
        for i, spec in enumerate(replicas):
            name, endpoint = parse_replica_flag(spec)
            from_flags.append(
                ReplicaConfig(
                    name,
                    endpoint,
                    replay=replays[i] if i < len(replays) else None,
                    dp_ranks=dp_ranks[i] if i < len(dp_ranks) else (dp_ranks[0] if dp_ranks else 1),
                    topic=topic,
                    metrics=metrics[i] if metrics and i < len(metrics) else None,
                    api=api_urls[i] if api_urls and i < len(api_urls) else None,
                )
            )
        if len(replays) > max(len(replicas), 1) or (replays and not replicas):
            raise ConfigError("--replay is given per --replica, in the same order")
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    settings = config.collector
    if replay_timeout is not None:
        settings = dataclasses.replace(settings, replay_timeout_s=replay_timeout)
    if max_message_bytes is not None:
        settings = dataclasses.replace(settings, max_message_bytes=max_message_bytes)
    merged = {r.name: r for r in [*config.replicas, *from_flags]}
    return dataclasses.replace(config, replicas=list(merged.values()), collector=settings)


def with_store_flags(
    config: Config,
    url: str | None,
    shard: str | None,
    spill_bytes: int | None,
    spill_dir: str | None,
    lease: bool | None = None,
    log_dictionary_bytes: int | None = None,
) -> Config:
    """The file's [store] with each flag (or its environment variable) that was given on top."""
    file = config.store
    store = dataclasses.replace(
        file,
        lease=file.lease if lease is None else lease,
        url=file.url if url is None else url,
        shard=file.shard if shard is None else shard,
        spill_bytes=file.spill_bytes if spill_bytes is None else spill_bytes,
        spill_dir=file.spill_dir if spill_dir is None else spill_dir,
        log_dictionary_bytes=(
            file.log_dictionary_bytes if log_dictionary_bytes is None else log_dictionary_bytes
        ),
    )
    return dataclasses.replace(config, store=store)


def with_lease_flags(config: Config, ttl: float | None, renew: float | None) -> Config:
    """The file's lease timing with each flag (or its environment variable) given on top."""
    store = config.store
    try:
        store = dataclasses.replace(
            store,
            lease_ttl_s=store.lease_ttl_s if ttl is None else ttl,
            lease_renew_s=store.lease_renew_s if renew is None else renew,
        )
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    return dataclasses.replace(config, store=store)


def with_fleet_flags(
    config: Config,
    bind: str | None,
    topic_pattern: str | None,
    replica_format: str | None,
    replay_template: str | None,
    gone_after: float | None,
) -> Config:
    """The file's [fleet] with each flag (or its environment variable) that was given on top."""
    try:
        fleet = fleet_with_flags(
            config.fleet, bind, topic_pattern, replica_format, replay_template, gone_after
        )
    except FleetError as exc:
        raise fail(str(exc)) from exc
    return dataclasses.replace(config, fleet=fleet)
