"""GET /metrics: kvscope's state as Prometheus metrics, read from the maps at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from kvscope.api.data import ApiData
from kvscope.collector.fleet_router import Refusal
from kvscope.collector.metrics import METRICS, MetricSpec

SPECS = {spec.name: spec for spec in METRICS}


def _family(spec: MetricSpec) -> GaugeMetricFamily | CounterMetricFamily:
    if spec.kind == "counter":
        # prometheus_client adds `_total` to a counter family's name itself.
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=spec.labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


class StateCollector(PromCollector):
    """Reads the collector's maps and counters and the writer's stats on each scrape."""

    def __init__(self, data: ApiData) -> None:
        self.data = data

    def collect(self) -> Iterable[Metric]:
        f = {
            name: _family(spec)
            for name, spec in SPECS.items()
            if not spec.name.startswith("kvscope_resets_")
        }
        collector = self.data.collector
        if collector is not None:
            f["kvscope_collector_up"].add_metric([], float(collector.up))
            now = time.time()
            with collector.lock:
                for stream, ingest in collector.ingests.items():
                    s = [stream.replica, str(stream.rank)]
                    c, m = ingest.counters, ingest.map.counters
                    f["kvscope_stream_connected"].add_metric(
                        s, float(collector.is_connected(stream))
                    )
                    f["kvscope_stream_silent"].add_metric(
                        s, float(collector.is_silent(stream, now))
                    )
                    f["kvscope_stream_degraded"].add_metric(s, float(ingest.degraded is not None))
                    f["kvscope_stream_gone"].add_metric(s, float(collector.is_gone(stream)))
                    f["kvscope_stream_tail_unverified"].add_metric(
                        s, float(ingest.tail_unverified(now))
                    )
                    f["kvscope_stream_epoch"].add_metric(s, ingest.epoch)
                    f["kvscope_stream_last_seq"].add_metric(
                        s, -1 if ingest.last_seq is None else ingest.last_seq
                    )
                    received = ingest.last_message_at
                    if received is not None:
                        f["kvscope_stream_last_batch_age_seconds"].add_metric(
                            s, max(0.0, now - received)
                        )
                        if m.last_ts is not None:
                            f["kvscope_stream_engine_clock_offset_seconds"].add_metric(
                                s, received - m.last_ts
                            )
                    for key, t in ingest.map.stats().items():
                        tl = [*s, key.medium, str(key.group)]
                        f["kvscope_cache_blocks"].add_metric(tl, t.blocks)
                        f["kvscope_cache_hittable_blocks"].add_metric(tl, t.hittable)
                        f["kvscope_cache_orphan_blocks"].add_metric(tl, t.orphans)
                    f["kvscope_ingest_batches_total"].add_metric(s, c.batches_applied)
                    for kind, n in (
                        ("BlockStored", m.stored_events),
                        ("BlockRemoved", m.removed_events),
                        ("AllBlocksCleared", m.cleared_events),
                    ):
                        f["kvscope_ingest_events_total"].add_metric([*s, kind], n)
                    for kind, n in (("stored", m.stored_blocks), ("removed", m.removed_blocks)):
                        f["kvscope_ingest_block_events_total"].add_metric([*s, kind], n)
                    for kind, n in c.malformed.items():
                        f["kvscope_ingest_malformed_total"].add_metric([*s, kind], n)
                    for (stage, kind), n in c.ingest_errors.items():
                        f["kvscope_ingest_errors_total"].add_metric([*s, stage, kind], n)
                    f["kvscope_ingest_tail_checks_total"].add_metric(s, c.tail_checks)
                    f["kvscope_ingest_duplicates_total"].add_metric(s, c.duplicates)
                    f["kvscope_ingest_gaps_total"].add_metric(s, c.gaps)
                    f["kvscope_ingest_replays_total"].add_metric([*s, "ok"], c.replays_ok)
                    f["kvscope_ingest_replays_total"].add_metric([*s, "failed"], c.replays_failed)
                    f["kvscope_ingest_restarts_total"].add_metric(s, c.restarts)
                    f["kvscope_ingest_clears_total"].add_metric(s, m.clears)
                # Every reason from the start, 0 without a fleet: a rate needs the zero.
                fleet = collector.fleet
                refused = fleet.router.refused if fleet is not None else {}
                registered = fleet.router.registered if fleet is not None else 0
                f["kvscope_fleet_publishers"].add_metric([], registered)
                for reason in Refusal:
                    f["kvscope_fleet_refused_messages_total"].add_metric(
                        [reason.value], refused.get(reason, 0)
                    )
        writer = self.data.writer
        if writer is not None:
            st = writer.stats
            f["kvscope_store_queue_rows"].add_metric([], writer.queue_depth)
            f["kvscope_store_spill_bytes"].add_metric([], writer.spill_bytes)
            f["kvscope_store_queue_bytes"].add_metric([], writer.memory_bytes)
            f["kvscope_store_rare_spilled_rows_total"].add_metric([], writer.rare_spilled_total)
            f["kvscope_store_spilled_rows_total"].add_metric([], writer.spilled_rows_total)
            f["kvscope_store_dropped_batches_total"].add_metric([], st.batches_dropped)
            f["kvscope_store_write_seconds_total"].add_metric([], st.write_seconds_total)
            f["kvscope_store_transactions_total"].add_metric([], st.transactions)
            f["kvscope_store_retries_total"].add_metric([], st.retries)
            f["kvscope_store_rows_refused_total"].add_metric([], st.rows_refused)
            f["kvscope_store_writer_up"].add_metric([], float(writer.up))
            held, turned_away, unreadable = writer.reset_followers
            f["kvscope_store_reset_followers"].add_metric([], held)
            f["kvscope_store_reset_followers_turned_away_total"].add_metric([], turned_away)
            f["kvscope_store_reset_groups_unreadable_total"].add_metric([], unreadable)
            # At 0 without leases, as the fleet's: the dashboard's rates have their zero.
            fence = writer.fence
            leases = (0, 0, 0, 0)
            if fence is not None:
                held, stats = len(fence.held()), fence.stats
                leases = (held, stats.takeovers, stats.lost, fence.refused_rows)
            for name, value in zip(LEASE_METRICS, leases, strict=True):
                f[name].add_metric([], value)
        yield from f.values()


LEASE_METRICS = (
    "kvscope_leases_held",
    "kvscope_leases_takeovers_total",
    "kvscope_leases_lost_total",
    "kvscope_store_rows_fenced_total",
)


def make_registry(data: ApiData) -> tuple[CollectorRegistry, Counter]:
    """A registry of its own (never the process-wide one) and the reset-request counter."""
    registry = CollectorRegistry()
    registry.register(StateCollector(data))
    spec = SPECS["kvscope_resets_requested_total"]
    resets = Counter(spec.name, spec.help, list(spec.labels), registry=registry)
    return registry, resets
