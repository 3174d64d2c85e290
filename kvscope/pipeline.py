"""Collector, store writer, pruner and scraper, started and stopped in the right order."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

from kvscope.collector.sink import ResumePoint
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.config import Config, ConfigError
from kvscope.options import err, fail
from kvscope.storage.dangling import close_dangling_connections
from kvscope.storage.resume import resume_point
from kvscope.storage.retention import Retention
from kvscope.storage.writer import StoreWriter
from kvscope.store_commands import closing_writer, open_writer, scraping

logger = logging.getLogger(__name__)
FAILED_EXIT = 1
"""Exit status once the collector's loop or the store's writer stopped by itself (a supervisor
restarts the process, and the store's resume takes over as after a kill -9)."""


class StoreStarter:
    """A stream starts where the store left it (`collector.fleet.StreamStarter`): at start-up
    for configured replicas, when first heard for a fleet's publishers."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer

    def resume_point(self, stream: StreamId) -> ResumePoint | None:
        close_dangling_connections(self.writer.engine, stream)
        point = resume_point(self.writer.engine, stream)
        if point is not None:
            self.writer.resumed(point)  # the recovery window it left open, followed on
        return point


@contextmanager
def running_pipeline(config: Config) -> Iterator[tuple[Collector, StoreWriter | None]]:
    """A running collector (resumed from `config.store`, when there is one) and its writer.

    On the way out the sockets close first, then the store is flushed.
    """
    if not config.replicas and config.fleet is None:
        raise fail(
            "no replica: give --replica NAME=ENDPOINT, --bind ADDRESS for a fleet, or a "
            "--config file with [[replica]] or [fleet]"
        )
    try:
        streams = [s for r in config.replicas for s in r.streams()]
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    writer = open_writer(config.store, [s.stream for s in streams])
    starter = None if writer is None else StoreStarter(writer)
    collector = Collector(
        streams, settings=config.collector, sink=writer, fleet=config.fleet, starter=starter
    )
    if starter is not None:
        for stream in collector.ingests:
            point = starter.resume_point(stream)
            if point is not None:
                collector.resume(point)
    scrape_targets = {r.name: r.metrics for r in config.replicas if r.metrics}
    with closing_writer(writer, Retention()), scraping(writer, scrape_targets), collector:
        yield collector, writer


def failure(collector: Collector, writer: StoreWriter | None) -> str | None:
    """What stopped by itself, if anything did: the collector's loop or the store's writer."""
    if not collector.up:
        return f"the collector stopped: {collector.failure}"
    if writer is not None and not writer.up:
        return f"the store writer stopped: {writer.failure}"
    return None


@contextmanager
def watching(
    collector: Collector, writer: StoreWriter | None, on_down: Callable[[], None]
) -> Iterator[None]:
    """Calls `on_down` (once, from a watcher thread) if the collector's loop or the store's
    writer stops by itself."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.25):
            why = failure(collector, writer)
            if why is not None:
                logger.error("%s: shutting down", why)
                on_down()
                return

    watcher = threading.Thread(target=watch, name="kvscope-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def exit_if_failed(collector: Collector, writer: StoreWriter | None) -> None:
    """After the pipeline closed (store flushed): a collector or writer that died ends the
    command with a non-zero status."""
    why = failure(collector, writer)
    if why is not None:
        err.print(f"[red]error:[/] {why}", soft_wrap=True)
        raise typer.Exit(FAILED_EXIT)
