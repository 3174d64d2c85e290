"""The `kvscope` command: collect live streams, replay recorded ones, run the demo."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import Progress

from kvscope import __version__
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.playback import play_into
from kvscope.collector.types import StreamId
from kvscope.config import StoreConfig
from kvscope.daemon_flags import with_daemon_flags
from kvscope.dashboards.cli import dashboards_app
from kvscope.fleet_config import (
    BindOpt,
    GoneAfterOpt,
    ReplayTemplateOpt,
    ReplicaFormatOpt,
    TopicPatternOpt,
)
from kvscope.lab.cli import register_lab
from kvscope.limit_options import (
    MaxBlockSizeOpt,
    MaxBlocksOpt,
    MaxTablesOpt,
    MaxTokenBytesOpt,
)
from kvscope.options import (
    ConfigOpt,
    DpRanksOpt,
    DurationOpt,
    JsonOpt,
    LeaseOpt,
    LeaseRenewOpt,
    LeaseTtlOpt,
    MaxMessageOpt,
    MetricsOpt,
    ReplayOpt,
    ReplayTimeoutOpt,
    ReplicaOpt,
    ShardOpt,
    TokenizerOpt,
    TopicOpt,
    fail,
    load_config,
    token_text,
)
from kvscope.pipeline import exit_if_failed, failure, running_pipeline
from kvscope.serve import register as register_serve
from kvscope.signals import stop_on_signals
from kvscope.store_commands import (
    LogDictionaryBytesOpt,
    SpillBytesOpt,
    SpillDirOpt,
    StoreFlag,
    StoreOption,
    closing_writer,
    open_writer,
    register,
)
from kvscope.views import stream_table

app = typer.Typer(
    name="kvscope",
    help="See what is in a vLLM prefix cache, what a reset did to it, and how it recovered.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    # A traceback must not print local variables: a store URL with its password, a token.
    pretty_exceptions_show_locals=False,
)
console = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        console.print(f"kvscope {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    log_level: Annotated[
        str, typer.Option(envvar="KVSCOPE_LOG_LEVEL", help="Logging level (DEBUG, INFO, ...).")
    ] = "WARNING",
) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@app.command()
def collect(
    replica: ReplicaOpt = [],  # noqa: B006 - typer reads the default
    replay: ReplayOpt = [],  # noqa: B006
    metrics: MetricsOpt = [],  # noqa: B006
    dp_ranks: DpRanksOpt = [],  # noqa: B006
    topic: TopicOpt = "",
    config_file: ConfigOpt = None,
    replay_timeout: ReplayTimeoutOpt = None,
    max_message_bytes: MaxMessageOpt = None,
    duration: DurationOpt = None,
    live: Annotated[bool, typer.Option(help="Show the live terminal view.")] = True,
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
) -> None:
    """Subscribe to replicas' KV event streams and keep each one's prefix-cache map."""
    config = load_config(
        config_file, replica, replay, dp_ranks, topic, replay_timeout, max_message_bytes, metrics
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
    deadline = None if duration is None else time.monotonic() + duration
    pipeline = running_pipeline(config)
    with stop_on_signals() as stop, pipeline as (collector, writer, _):

        def running() -> bool:
            return (
                not stop.wait(0.5)
                and failure(collector, writer) is None
                and (deadline is None or time.monotonic() < deadline)
            )

        if live:
            with Live(stream_table(collector), console=console, refresh_per_second=2) as view:
                while running():
                    view.update(stream_table(collector))
        else:
            while running():
                pass
    console.print(stream_table(collector))
    exit_if_failed(collector, writer)


@app.command()
def replay(
    capture: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, metavar="CAPTURE", help="Capture file."),
    ],
    replica: Annotated[str, typer.Option(help="Name to give the recorded replica.")] = "replica",
    rank: Annotated[int, typer.Option(help="Its data-parallel rank.")] = 0,
    dump_at: Annotated[
        str | None,
        typer.Option(help="SEQ[,SEQ...]: write the map after every batch with seq <= SEQ."),
    ] = None,
    dump_dir: Annotated[Path | None, typer.Option(help="Where DIR/SEQ.jsonl dumps go.")] = None,
    store: StoreOption = "none",
) -> None:
    """Feed a recorded stream through the live ingest path; optionally dump the map on the way."""
    try:
        seqs = [int(s) for s in dump_at.split(",") if s.strip()] if dump_at else []
    except ValueError as exc:
        raise fail(f"--dump-at {dump_at!r}: expected SEQ[,SEQ...] of integers") from exc
    if seqs and dump_dir is None:
        raise fail("--dump-at needs --dump-dir")
    try:
        records = list(read_capture(capture))
    except (OSError, ValueError, EOFError) as exc:
        raise fail(f"cannot read capture {capture}: {exc}") from exc
    writer = open_writer(StoreConfig(store))
    ingest = StreamIngest(StreamId(replica, rank), can_replay=False, sink=writer)
    with Progress(console=err, transient=True) as progress, closing_writer(writer):
        task = progress.add_task("replaying", total=len(records))
        written = play_into(
            ingest,
            records,
            dump_at=seqs,
            dump_dir=dump_dir,
            progress=lambda n: progress.update(task, completed=n) if n % 500 == 0 else None,
        )
    totals = ingest.map.totals()
    c = ingest.counters
    console.print(
        f"{len(records)} messages, {c.batches_applied} batches applied, "
        f"last seq {ingest.last_seq}, "
        f"epoch {ingest.epoch}, {c.gaps} gaps, {c.restarts} restarts, "
        f"{sum(c.malformed.values())} malformed, {sum(c.ingest_errors.values())} failed"
    )
    console.print(
        f"map: {totals.blocks} blocks ({totals.copies} copies), {totals.hittable} hittable, "
        f"{totals.orphans} orphans" + (" [red]DEGRADED[/]" if ingest.degraded else "")
    )
    for path in written:
        console.print(f"wrote {path}")


@app.command()
def demo(
    speed: Annotated[
        float,
        typer.Option(help="Multiple of real time for the replicas; 0 = as fast as possible."),
    ] = 0.0,
    source: Annotated[
        str,
        typer.Option(
            envvar="KVSCOPE_DEMO_SOURCE",
            help="lab (vLLM's scheduler; needs vLLM), capture (the bundled recording) or auto.",
        ),
    ] = "auto",
    store: Annotated[
        str | None, typer.Option(help="Store URL [default: sqlite in --out, made afresh].")
    ] = None,
    port: Annotated[int, typer.Option(help="API port on 127.0.0.1; 0 = a free one.")] = 0,
    out: Annotated[Path, typer.Option(help="Where the report goes.")] = Path("kvscope-demo"),
    serve: Annotated[
        bool, typer.Option("--serve", help="Keep everything running until SIGINT/SIGTERM.")
    ] = False,
    tokenizer: TokenizerOpt = None,
    config_file: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Two replicas, real sockets, collector + store + API, and what each reset did.

    With vLLM installed: two lab replicas (vLLM 0.33's real scheduler, simulated time), reset
    once in each mode (default, preempt, keep) through kvscope's own POST
    /replicas/{replica}/reset. Without: the bundled recording of the same scheduler with
    resets in the three modes, played by two stand-in publishers. Prints a before/after table
    per reset, checks each map against vLLM's BlockPool, writes a report into --out. Exit 1
    when a map is not exact.
    """
    from kvscope.demo import DemoOptions, run_demo

    if source not in ("auto", "lab", "capture"):
        raise fail(f"--source {source!r}: expected auto, lab or capture")
    text = token_text(tokenizer, config_file)
    options = DemoOptions(speed, source, store, port, out, serve, text, as_json)
    # With --json, stdout carries the one document; the progress goes to stderr.
    raise typer.Exit(run_demo(err if as_json else console, options))


def _report_commands() -> None:
    from kvscope.record import record
    from kvscope.report import report

    app.command("report")(report)
    app.command("record")(record)


register(app)
register_serve(app)
_report_commands()
register_lab(app)
app.add_typer(dashboards_app, name="dashboards")

if __name__ == "__main__":
    app()
