"""The names of kvscope's Prometheus metrics: one list, read by /metrics and the dashboards.

Names are `kvscope_<subsystem>_<name>_<unit>`, base units only, counters end in `_total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...]


STREAM = ("replica", "rank")
TABLE = ("replica", "rank", "medium", "group")

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "kvscope_collector_up",
        "gauge",
        "1 while the collector's loop runs; 0 once it stopped by itself (see /readyz).",
        (),
    ),
    MetricSpec(
        "kvscope_stream_connected", "gauge", "1 while the stream's socket is connected.", STREAM
    ),
    MetricSpec(
        "kvscope_stream_silent",
        "gauge",
        "1 when no batch arrived for a while (idle engines send nothing).",
        STREAM,
    ),
    MetricSpec(
        "kvscope_stream_gone",
        "gauge",
        "1 when a fleet's publisher was silent past gone_after_s (kept; 1 -> 0 when heard again).",
        STREAM,
    ),
    MetricSpec(
        "kvscope_fleet_publishers",
        "gauge",
        "Streams a fleet's bound socket registered (gone ones included), up to max_publishers.",
        (),
    ),
    MetricSpec(
        "kvscope_fleet_refused_messages_total",
        "counter",
        "Messages on a fleet's bound socket that no stream took, by reason (unmatched topic, "
        "full, name_taken, frame_count).",
        ("reason",),
    ),
    MetricSpec(
        "kvscope_stream_degraded", "gauge", "1 while the map is known to be incomplete.", STREAM
    ),
    MetricSpec(
        "kvscope_stream_tail_unverified",
        "gauge",
        "1 when silent and no replay showed that no batch was lost at the stream's end.",
        STREAM,
    ),
    MetricSpec(
        "kvscope_stream_epoch", "gauge", "Publisher epoch: +1 at each restart seen.", STREAM
    ),
    MetricSpec("kvscope_stream_last_seq", "gauge", "Seq of the last batch applied.", STREAM),
    MetricSpec(
        "kvscope_stream_last_batch_age_seconds",
        "gauge",
        "Seconds since the last batch arrived (collector clock; idle engines send nothing).",
        STREAM,
    ),
    MetricSpec(
        "kvscope_stream_engine_clock_offset_seconds",
        "gauge",
        "Arrival time minus stamp of the last batch: the engine clock's offset plus transit.",
        STREAM,
    ),
    MetricSpec("kvscope_cache_blocks", "gauge", "Distinct cached block hashes.", TABLE),
    MetricSpec(
        "kvscope_cache_hittable_blocks",
        "gauge",
        "Cached blocks whose every ancestor is cached.",
        TABLE,
    ),
    MetricSpec(
        "kvscope_cache_orphan_blocks", "gauge", "Cached blocks whose parent is not cached.", TABLE
    ),
    MetricSpec("kvscope_ingest_batches_total", "counter", "Batches applied to the map.", STREAM),
    MetricSpec(
        "kvscope_ingest_events_total", "counter", "Events applied, by type.", (*STREAM, "type")
    ),
    MetricSpec(
        "kvscope_ingest_block_events_total",
        "counter",
        "Block hashes stored and removed, by type.",
        (*STREAM, "type"),
    ),
    MetricSpec(
        "kvscope_ingest_malformed_total", "counter", "Input refused, by kind.", (*STREAM, "kind")
    ),
    MetricSpec(
        "kvscope_ingest_errors_total",
        "counter",
        "Messages whose handling failed, by stage and kind; each marked the map unknown.",
        (*STREAM, "stage", "kind"),
    ),
    MetricSpec(
        "kvscope_ingest_tail_checks_total",
        "counter",
        "Replays asked for after a silence, to find batches lost at the stream's end.",
        STREAM,
    ),
    MetricSpec(
        "kvscope_ingest_duplicates_total", "counter", "Batches received twice and dropped.", STREAM
    ),
    MetricSpec("kvscope_ingest_gaps_total", "counter", "Seq gaps seen.", STREAM),
    MetricSpec(
        "kvscope_ingest_replays_total",
        "counter",
        "Replays, by outcome (ok, failed).",
        (*STREAM, "outcome"),
    ),
    MetricSpec("kvscope_ingest_restarts_total", "counter", "Publisher restarts seen.", STREAM),
    MetricSpec("kvscope_ingest_clears_total", "counter", "AllBlocksCleared applied.", STREAM),
    MetricSpec(
        "kvscope_resets_requested_total",
        "counter",
        "Resets asked for through kvscope, by mode and outcome.",
        ("replica", "mode", "outcome"),
    ),
    MetricSpec("kvscope_store_queue_rows", "gauge", "Rows waiting for the store.", ()),
    MetricSpec(
        "kvscope_store_queue_bytes",
        "gauge",
        "Bytes of the rows waiting in memory (payloads, map snapshots); bounded by queue_bytes.",
        (),
    ),
    MetricSpec(
        "kvscope_store_rare_spilled_rows_total",
        "counter",
        "Resets and other rare rows that waited on disk past the spill's cap (never dropped).",
        (),
    ),
    MetricSpec(
        "kvscope_store_writer_up",
        "gauge",
        "1 while the store's writer thread runs; 0 once it stopped by itself (see /readyz).",
        (),
    ),
    MetricSpec(
        "kvscope_store_rows_refused_total",
        "counter",
        "Rows the store refused for good (a value it cannot hold), left out and logged.",
        (),
    ),
    MetricSpec(
        "kvscope_leases_held",
        "gauge",
        "Streams whose lease this collector holds (collect --lease); 0 without leases.",
        (),
    ),
    MetricSpec(
        "kvscope_leases_takeovers_total",
        "counter",
        "Leases this collector took from one whose heartbeat had stopped (a collector died).",
        (),
    ),
    MetricSpec(
        "kvscope_leases_lost_total",
        "counter",
        "Leases found taken by another collector (this one had not renewed in time).",
        (),
    ),
    MetricSpec(
        "kvscope_store_rows_fenced_total",
        "counter",
        "Rows left out at a write because their stream's lease was no longer this collector's.",
        (),
    ),
    MetricSpec(
        "kvscope_store_spill_bytes",
        "gauge",
        "Bytes of rows the queue had no room for, waiting in the local spill file.",
        (),
    ),
    MetricSpec(
        "kvscope_store_spilled_rows_total",
        "counter",
        "Rows that waited in the spill file (none lost; only past its cap are batches dropped).",
        (),
    ),
    MetricSpec(
        "kvscope_store_dropped_batches_total",
        "counter",
        "Batches the store could not keep (marked incomplete).",
        (),
    ),
    MetricSpec(
        "kvscope_store_write_seconds_total", "counter", "Time spent in store transactions.", ()
    ),
    MetricSpec("kvscope_store_transactions_total", "counter", "Store transactions committed.", ()),
    MetricSpec(
        "kvscope_store_retries_total", "counter", "Store transactions retried after an error.", ()
    ),
    MetricSpec(
        "kvscope_store_reset_followers",
        "gauge",
        "Recovering resets the writer follows in memory (storage/prefix_followers.py).",
        (),
    ),
    MetricSpec(
        "kvscope_store_reset_followers_turned_away_total",
        "counter",
        "Answers of recovering resets not followed for want of room (prefix_follower_bytes): "
        "each computed in full from the store.",
        (),
    ),
    MetricSpec(
        "kvscope_store_reset_groups_unreadable_total",
        "counter",
        "Answers of recovering resets left without prefix groups: their log could not be read "
        "(a lost dictionary or checkpoint).",
        (),
    ),
)

NAMES = frozenset(spec.name for spec in METRICS)
