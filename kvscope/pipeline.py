"""Collector, store writer, pruner and scraper, started and stopped in the right order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvscope.collector.subscriber import Collector
from kvscope.config import Config, ConfigError
from kvscope.options import fail
from kvscope.storage.resume import resume_point
from kvscope.storage.retention import Retention
from kvscope.storage.writer import StoreWriter
from kvscope.store_commands import closing_writer, open_writer, scraping


@contextmanager
def running_pipeline(
    config: Config, store: str, shard: str | None
) -> Iterator[tuple[Collector, StoreWriter | None]]:
    """A running collector (resumed from the store, when there is one) and its writer.

    On the way out the sockets close first, then the store is flushed.
    """
    if not config.replicas:
        raise fail("no replica: give --replica NAME=ENDPOINT or a --config file with [[replica]]")
    try:
        streams = [s for r in config.replicas for s in r.streams()]
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    writer = open_writer(store, [s.stream for s in streams], shard)
    collector = Collector(streams, settings=config.collector, sink=writer)
    if writer is not None:
        for stream in collector.ingests:
            point = resume_point(writer.engine, stream)
            if point is not None:
                collector.resume(point)
                writer.resumed(point)  # the recovery window it left open, followed on
    scrape_targets = {r.name: r.metrics for r in config.replicas if r.metrics}
    with closing_writer(writer, Retention()), scraping(writer, scrape_targets), collector:
        yield collector, writer
