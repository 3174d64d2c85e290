"""`kvscope serve` (collector, store and API in one process) and `kvscope api` (the API alone
over a store that other collectors write)."""

from __future__ import annotations

import gc
import logging
from contextlib import nullcontext
from typing import Annotated

import typer
import uvicorn
from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.collector.subscriber import Collector
from kvscope.config import Config
from kvscope.daemon_flags import with_daemon_flags
from kvscope.fleet_config import (
    BindOpt,
    GoneAfterOpt,
    ReplayTemplateOpt,
    ReplicaFormatOpt,
    TopicPatternOpt,
)
from kvscope.limit_options import (
    MaxBlockSizeOpt,
    MaxBlocksOpt,
    MaxTablesOpt,
    MaxTokenBytesOpt,
)
from kvscope.options import (
    ApiUrlOpt,
    ConfigOpt,
    DpRanksOpt,
    HostOpt,
    LeaseOpt,
    LeaseRenewOpt,
    LeaseTtlOpt,
    MaxMessageOpt,
    MetricsOpt,
    PortOpt,
    ReplayOpt,
    ReplayTimeoutOpt,
    ReplicaOpt,
    ShardOpt,
    TokenizerOpt,
    TokenOpt,
    TopicOpt,
    checked_token,
    fail,
    load_config,
    token_text,
)
from kvscope.pipeline import exit_if_failed, running_pipeline, watching
from kvscope.signals import stop_on_signals
from kvscope.storage.engine import StoreError, may_write, open_store
from kvscope.storage.redact import redact
from kvscope.storage.token_text import TokenText
from kvscope.storage.writer import StoreWriter
from kvscope.store_commands import LogDictionaryBytesOpt, SpillBytesOpt, SpillDirOpt, StoreFlag

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8087


def api_settings(config: Config, token: str | None, text: TokenText | None = None) -> ApiSettings:
    urls = {r.name: r.api_url for r in config.replicas if r.api_url}
    return ApiSettings(api_token=token, replica_urls=urls, token_text=text)


def primed(data: ApiData) -> ApiData:
    """`data` with the store's list of streams read now, while the store answers: the list the
    API keeps answering with through a later outage."""
    try:
        data.streams()
    except SQLAlchemyError as exc:
        logger.warning("the store does not answer yet (%s): 503 until it does", type(exc).__name__)
    return data


def api_server(app: FastAPI, host: str, port: int) -> uvicorn.Server:
    """uvicorn as `kvscope serve` and `kvscope api` run it (benchmarks/api.py measures it).

    What start-up allocated (imports, the collector, the app) lives as long as the process:
    `gc.freeze` keeps the cyclic GC off it. Each full collection walked it all, holding the GIL
    ~90 ms (once every several seconds under load) while every request in flight waited.
    """
    gc.collect()
    gc.freeze()
    return uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    )


def run_uvicorn(
    app: FastAPI,
    host: str,
    port: int,
    collector: Collector | None = None,
    writer: StoreWriter | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, or until `collector` stops by itself.

    uvicorn shuts down gracefully on either signal, then re-raises it with the handlers it
    found in place: ours, so the process still goes on to flush the store and exit 0.
    """
    server = api_server(app, host, port)

    def stop_serving() -> None:
        server.should_exit = True

    watch = watching(collector, writer, stop_serving) if collector else nullcontext()
    with stop_on_signals(), watch:
        server.run()


def serve(
    replica: ReplicaOpt = [],  # noqa: B006 - typer reads the default
    replay: ReplayOpt = [],  # noqa: B006
    metrics: MetricsOpt = [],  # noqa: B006
    api_url: ApiUrlOpt = [],  # noqa: B006
    dp_ranks: DpRanksOpt = [],  # noqa: B006
    topic: TopicOpt = "",
    config_file: ConfigOpt = None,
    replay_timeout: ReplayTimeoutOpt = None,
    max_message_bytes: MaxMessageOpt = None,
    store: StoreFlag = None,
    shard: ShardOpt = None,
    lease: LeaseOpt = None,
    lease_ttl: LeaseTtlOpt = None,
    lease_renew: LeaseRenewOpt = None,
    spill_bytes: SpillBytesOpt = None,
    spill_dir: SpillDirOpt = None,
    log_dictionary_bytes: LogDictionaryBytesOpt = None,
    bind: BindOpt = None,
    topic_pattern: TopicPatternOpt = None,
    replica_format: ReplicaFormatOpt = None,
    replay_template: ReplayTemplateOpt = None,
    gone_after: GoneAfterOpt = None,
    max_block_size: MaxBlockSizeOpt = None,
    max_tables_per_stream: MaxTablesOpt = None,
    max_blocks_per_stream: MaxBlocksOpt = None,
    max_token_bytes_per_stream: MaxTokenBytesOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = DEFAULT_PORT,
    api_token: TokenOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Collector, store and API in one process: the embedded default (SQLite, 127.0.0.1)."""
    api_token = checked_token(api_token)
    text = token_text(tokenizer, config_file)
    config = load_config(
        config_file,
        replica,
        replay,
        dp_ranks,
        topic,
        replay_timeout,
        max_message_bytes,
        metrics,
        api_url,
    )
    config = with_daemon_flags(
        config,
        store=store,
        shard=shard,
        lease=lease,
        lease_ttl=lease_ttl,
        lease_renew=lease_renew,
        spill_bytes=spill_bytes,
        spill_dir=spill_dir,
        log_dictionary_bytes=log_dictionary_bytes,
        bind=bind,
        topic_pattern=topic_pattern,
        replica_format=replica_format,
        replay_template=replay_template,
        gone_after=gone_after,
        max_block_size=max_block_size,
        max_tables_per_stream=max_tables_per_stream,
        max_blocks_per_stream=max_blocks_per_stream,
        max_token_bytes_per_stream=max_token_bytes_per_stream,
    )
    with running_pipeline(config) as (collector, writer, leases):
        data = ApiData(
            collector=collector,
            engine=None if writer is None else writer.engine,
            writer=writer,
            leases=leases,
        )
        app = create_app(primed(data), api_settings(config, api_token, text))
        logger.warning("kvscope API on http://%s:%d (docs at /docs)", host, port)
        run_uvicorn(app, host, port, collector, writer)
    exit_if_failed(collector, writer)


def api(
    store: StoreFlag = None,
    config_file: ConfigOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = DEFAULT_PORT,
    api_token: TokenOpt = None,
    api_url: Annotated[
        list[str],
        typer.Option("--api-url", help="NAME=URL of a replica's vLLM API server (for resets)."),
    ] = [],  # noqa: B006
    tokenizer: TokenizerOpt = None,
) -> None:
    """The API alone, over a store written by `kvscope collect` processes."""
    api_token = checked_token(api_token)
    config = load_config(config_file, [], [], [], "", None, None)
    store = config.store.url if store is None else store
    settings = api_settings(config, api_token, token_text(tokenizer, config_file))
    for spec in api_url:
        name, _, url = spec.partition("=")
        settings.replica_urls[name] = url
    try:
        # A store it may not write is served read-only (its reset requests go unrecorded).
        engine = open_store(store, read_only=not may_write(store))
    except (SQLAlchemyError, StoreError) as exc:
        raise fail(redact(f"cannot open store {store}: {str(exc).splitlines()[0]}")) from exc
    app = create_app(primed(ApiData(engine=engine)), settings)
    logger.warning("kvscope API on http://%s:%d over %s", host, port, redact(store))
    run_uvicorn(app, host, port)


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command("api")(api)
