"""Collector, store writer, pruner and scraper, started and stopped in the right order."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import NamedTuple

import typer

from kvscope.collector.fleet import NotNow
from kvscope.collector.limits import DEFAULT_LIMITS
from kvscope.collector.sink import ResumePoint
from kvscope.collector.subscriber import Collector
from kvscope.collector.types import StreamId
from kvscope.config import Config, ConfigError, StoreConfig
from kvscope.options import err, fail
from kvscope.storage.dangling import close_dangling_connections
from kvscope.storage.lease_keeper import LeaseKeeper, member_id
from kvscope.storage.leases import Fence, LeaseSettings, acquire
from kvscope.storage.resume import resume_point
from kvscope.storage.retention import Retention
from kvscope.storage.writer import StoreWriter
from kvscope.store_commands import NO_STORE, closing_writer, open_writer, scraping

logger = logging.getLogger(__name__)
FAILED_EXIT = 1
"""Exit status once the collector's loop or the store's writer stopped by itself (a supervisor
restarts the process, and the store's resume takes over as after a kill -9)."""


class StoreStarter:
    """A stream starts where the store left it (`collector.fleet.StreamStarter`): at start-up
    for configured replicas, when first heard for a fleet's publishers. With leases (a
    `fence`), a fleet's publisher is stored only if its lease is free: one that another
    collector holds is refused until its lease is free (asked again every `renew_s`)."""

    def __init__(
        self,
        writer: StoreWriter,
        fence: Fence | None = None,
        retry_s: float = LeaseSettings.renew_s,
    ) -> None:
        self.writer = writer
        self.fence = fence
        self.retry_s = retry_s
        """How soon a lease refused is asked for again (the lease round's turn)."""
        self._retry_at: dict[StreamId, float] = {}

    def resume_point(self, stream: StreamId) -> ResumePoint | None:
        if self.fence is not None:
            if stream in self.fence.draining or time.monotonic() < self._retry_at.get(stream, 0):
                raise NotNow(stream)
            with self.writer.engine.begin() as conn:
                grant = acquire(conn, stream, self.fence.member)
            if grant is None:  # refused (counted) until then
                self._retry_at[stream] = time.monotonic() + self.retry_s
                raise NotNow(stream)
            self.fence.hold(stream, grant.token)
        return self.from_store(stream)

    def from_store(self, stream: StreamId) -> ResumePoint | None:
        close_dangling_connections(self.writer.engine, stream)
        point = resume_point(self.writer.engine, stream)
        if point is not None:
            self.writer.resumed(point)  # the recovery window it left open, followed on
        return point


class Pipeline(NamedTuple):
    collector: Collector
    writer: StoreWriter | None
    leases: LeaseKeeper | None
    """With `lease`: the streams this collector holds (and whether it knows them yet)."""


@contextmanager
def running_pipeline(config: Config) -> Iterator[Pipeline]:
    """A running collector (resumed from `config.store`, when there is one), its writer and,
    with leases, its lease keeper.

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
    if config.store.url != NO_STORE and config.collector.limits != DEFAULT_LIMITS:
        # The store's rebuilds (history, resume, reset followers) replay the log under the
        # default limits, which decide what each batch did: other limits would rebuild another map.
        raise fail(
            "a stream's limits other than the defaults are not recorded in the store, whose "
            "rebuilds would then differ from the maps collected: give them with --store none"
        )
    fence = leased(config.store)
    writer = open_writer(config.store, [] if fence else [s.stream for s in streams], fence)
    leasing = config.store.lease_settings
    starter = None if writer is None else StoreStarter(writer, fence, leasing.renew_s)
    collector = Collector(
        [] if fence else streams,
        settings=config.collector,
        sink=writer,
        fleet=config.fleet,
        starter=starter,
    )
    keeper = None
    if fence is not None and writer is not None and starter is not None:
        keeper = LeaseKeeper(
            writer.engine, streams, collector, writer, fence, starter.from_store, leasing
        )
        fence.on_refused = keeper.fenced
    elif starter is not None:
        for stream in collector.ingests:
            point = starter.resume_point(stream)
            if point is not None:
                collector.resume(point)
    scrape_targets = {r.name: r.metrics for r in config.replicas if r.metrics}
    with ExitStack() as stack:
        if keeper is not None:  # leases released last, once the writer has flushed
            stack.enter_context(keeper.membership())
        stack.enter_context(closing_writer(writer, Retention()))
        stack.enter_context(scraping(writer, scrape_targets))
        stack.enter_context(collector)
        if keeper is not None:  # streams move only while the collector runs
            stack.enter_context(keeper.keeping())
        yield Pipeline(collector, writer, keeper)


def leased(store: StoreConfig) -> Fence | None:
    """With `lease`: this collector's fence (a member of its own); refused without a store or
    with a shard (leases replace the static split)."""
    if not store.lease:
        return None
    if store.url == NO_STORE:
        raise fail("--lease needs a shared PostgreSQL store (--store postgresql+psycopg://...)")
    if store.shard is not None:
        raise fail("--lease and --shard exclude each other: leases replace the static shards")
    return Fence(member_id())


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
