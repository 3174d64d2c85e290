"""The `kvscope` command: collect live streams, replay recorded ones, run the demo."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import Progress

from kvscope import __version__
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import DEFAULT_MAX_MESSAGE_BYTES, StreamIngest
from kvscope.collector.playback import play_into
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.config import Config, ConfigError, ReplicaConfig, load_file, parse_replica_flag
from kvscope.storage.resume import resume_ingest
from kvscope.storage.retention import Retention
from kvscope.store_commands import (
    DEFAULT_STORE,
    StoreOption,
    closing_writer,
    hooks_of,
    open_writer,
    register,
    scraping,
)
from kvscope.views import stream_table

app = typer.Typer(
    name="kvscope",
    help="See what is in a vLLM prefix cache, what a reset did to it, and how it recovered.",
    no_args_is_help=True,
    add_completion=False,
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


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}")
    return typer.Exit(2)


def _build_config(
    config_file: Path | None,
    replicas: list[str],
    replays: list[str],
    dp_ranks: list[int],
    topic: str,
    replay_timeout: float | None,
    max_message_bytes: int | None,
    metrics: list[str] | None = None,
) -> Config:
    config = load_file(config_file) if config_file else Config()
    from_flags = []
    for i, spec in enumerate(replicas):
        name, endpoint = parse_replica_flag(spec)
        replay = replays[i] if i < len(replays) else None
        ranks = dp_ranks[i] if i < len(dp_ranks) else (dp_ranks[0] if dp_ranks else 1)
        scrape = metrics[i] if metrics and i < len(metrics) else None
        from_flags.append(ReplicaConfig(name, endpoint, replay, ranks, topic, scrape))
    if len(replays) > max(len(replicas), 1) or (replays and not replicas):
        raise ConfigError("--replay is given per --replica, in the same order")
    settings = config.collector
    if replay_timeout is not None:
        settings = dataclasses.replace(settings, replay_timeout_s=replay_timeout)
    if max_message_bytes is not None:
        settings = dataclasses.replace(settings, max_message_bytes=max_message_bytes)
    merged = {r.name: r for r in [*config.replicas, *from_flags]}
    return Config(list(merged.values()), settings)


@app.command()
def collect(
    replica: Annotated[
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
    ] = [],  # noqa: B006 - typer reads the default
    replay: Annotated[
        list[str],
        typer.Option(help="Replay endpoint (vLLM's replay_endpoint), one per --replica, in order."),
    ] = [],  # noqa: B006
    metrics: Annotated[
        list[str],
        typer.Option(
            help="vLLM's /metrics URL, one per --replica, in order: scraped into the store."
        ),
    ] = [],  # noqa: B006
    dp_ranks: Annotated[
        list[int],
        typer.Option(help="Data-parallel ranks per replica (ports offset by rank, as vLLM does)."),
    ] = [],  # noqa: B006
    topic: Annotated[str, typer.Option(help="Topic prefix to subscribe to.")] = "",
    config_file: Annotated[
        Path | None, typer.Option("--config", envvar="KVSCOPE_CONFIG", help="TOML config file.")
    ] = None,
    replay_timeout: Annotated[
        float | None, typer.Option(envvar="KVSCOPE_REPLAY_TIMEOUT", help="Seconds.")
    ] = None,
    max_message_bytes: Annotated[
        int | None,
        typer.Option(
            envvar="KVSCOPE_MAX_MESSAGE_BYTES",
            help="Larger messages are refused at the socket "
            f"[default: {DEFAULT_MAX_MESSAGE_BYTES}]",
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: run until ^C).")
    ] = None,
    live: Annotated[bool, typer.Option(help="Show the live terminal view.")] = True,
    store: StoreOption = DEFAULT_STORE,
    shard: Annotated[
        str | None,
        typer.Option(
            envvar="KVSCOPE_SHARD",
            help="Name of this collector when several share one store, each with its own "
            "replicas; a replica another shard writes is refused.",
        ),
    ] = None,
) -> None:
    """Subscribe to replicas' KV event streams and keep each one's prefix-cache map."""
    try:
        config = _build_config(
            config_file,
            replica,
            replay,
            dp_ranks,
            topic,
            replay_timeout,
            max_message_bytes,
            metrics,
        )
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    if not config.replicas:
        raise _fail("no replica: give --replica NAME=ENDPOINT or a --config file with [[replica]]")
    try:
        streams = [s for r in config.replicas for s in r.streams()]
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    writer = open_writer(store, [s.stream for s in streams], shard)
    collector = Collector(
        streams,
        settings=config.collector,
        connection_observers=[writer.connection_changed] if writer else [],
        **hooks_of(writer),
    )
    if writer is not None:
        for ingest in collector.ingests.values():
            resume_ingest(writer.engine, ingest)
    deadline = None if duration is None else time.monotonic() + duration
    # Stopping (SIGTERM, SIGINT, --duration) closes the sockets first, then flushes the store.
    retention = Retention()
    scrape_targets = {r.name: r.metrics for r in config.replicas if r.metrics}
    with (
        stop_on_signals() as stop,
        closing_writer(writer, retention),
        scraping(writer, scrape_targets),
        collector,
    ):

        def running() -> bool:
            return not stop.wait(0.5) and (deadline is None or time.monotonic() < deadline)

        if live:
            with Live(stream_table(collector), console=console, refresh_per_second=2) as view:
                while running():
                    view.update(stream_table(collector))
        else:
            while running():
                pass
    console.print(stream_table(collector))


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT, so both end the command cleanly (exit 0)."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        logging.getLogger("kvscope").info("signal %d: stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@app.command()
def replay(
    capture: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Capture file.")],
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
        raise _fail(f"--dump-at {dump_at!r}: expected SEQ[,SEQ...] of integers") from exc
    if seqs and dump_dir is None:
        raise _fail("--dump-at needs --dump-dir")
    try:
        records = list(read_capture(capture))
    except (OSError, ValueError, EOFError) as exc:
        raise _fail(f"cannot read capture {capture}: {exc}") from exc
    writer = open_writer(store)
    hooks = hooks_of(writer)
    ingest = StreamIngest(StreamId(replica, rank), can_replay=False, **hooks)
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
        f"{sum(c.malformed.values())} malformed"
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
        float, typer.Option(help="Playback speed as a multiple of the recording; 0 = flat out.")
    ] = 0.0,
) -> None:
    """Play a bundled recording of vLLM's real scheduler through real sockets into the collector.

    The recording (vLLM 0.33's Scheduler on CPU, 3 req/s, resets in three modes) is served by a
    stand-in publisher speaking vLLM's protocol; the collector rebuilds the map and reports
    what each reset did, then checks the map against vLLM's own BlockPool snapshots.
    """
    from kvscope.demo import run_demo

    raise typer.Exit(run_demo(console, speed))


register(app)

if __name__ == "__main__":
    app()
