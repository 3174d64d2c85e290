"""Collector health: is kvscope keeping up, and is what it receives well formed?"""

from __future__ import annotations

from kvscope.dashboards.common import (
    COLLECTOR_HEALTH_UID,
    RATE,
    REPLICAS,
    kv,
    prometheus_variable,
    replica_variable,
)
from kvscope.dashboards.model import (
    Json,
    dashboard,
    override,
    prom,
    row,
    stat,
    thresholds,
    timeseries,
)


def _rate(name: str, by: str = "replica") -> str:
    return f"sum by ({by}) (rate({kv(name)}{{{REPLICAS}}}[{RATE}]))"


def _streams() -> list[Json]:
    def count(name: str, title: str, bad: bool) -> Json:
        return stat(
            title,
            [prom(f"sum({kv(name)}{{{REPLICAS}}})", title)],
            w=6,
            defaults={
                "color": {"mode": "thresholds"},
                "thresholds": thresholds((None, "green"), (1, "red"))
                if bad
                else thresholds((None, "red"), (1, "green")),
            },
        )

    def up(name: str, title: str, description: str) -> Json:
        """Red at 0: a part of some kvscope process stopped by itself."""
        return stat(
            title,
            [prom(f"min({kv(name)})", "up")],
            w=6,
            description=description,
            defaults={
                "color": {"mode": "thresholds"},
                "thresholds": thresholds((None, "red"), (1, "green")),
            },
        )

    return [
        row("Streams"),
        count("kvscope_stream_connected", "Connected streams", False),
        count("kvscope_stream_silent", "Silent streams", True),
        count("kvscope_stream_degraded", "Degraded streams", True),
        up(
            "kvscope_collector_up",
            "Collector up",
            "0 once a collector's loop stopped by itself: nothing is collected, /readyz says "
            "why, and the process exits 1 for its supervisor to restart it.",
        ),
        count("kvscope_stream_tail_unverified", "Tail unverified", True),
        up(
            "kvscope_store_writer_up",
            "Store writer up",
            "0 once a store writer thread stopped by itself: nothing more is stored, /readyz "
            "says why, and the process exits 1.",
        ),
        stat(
            "Last seq",
            [
                prom(
                    f"max by (replica, rank) ({kv('kvscope_stream_last_seq')}{{{REPLICAS}}})",
                    "{{replica}}/{{rank}}",
                )
            ],
            w=6,
        ),
        count("kvscope_stream_gone", "Gone publishers", True),
        timeseries(
            "Fleet socket: publishers and refused messages",
            [
                prom(f"max({kv('kvscope_fleet_publishers')})", "publishers registered"),
                prom(
                    f"sum by (reason) (rate({kv('kvscope_fleet_refused_messages_total')}[{RATE}]))",
                    "refused: {{reason}}",
                    "B",
                ),
            ],
            description="A bound fleet socket (`--bind`): the publishers it registered (gone "
            "ones included, up to max_publishers), and the messages no stream took, by reason "
            "(a topic the pattern does not match, the cap reached, a name taken, bad frames). "
            "0 without a fleet.",
            unit="short",
            min_value=0,
            w=24,
            overrides=[override("refused: {{reason}}", unit="ops")],
        ),
    ]


def _events() -> list[Json]:
    malformed = _rate("kvscope_ingest_malformed_total")
    applied = _rate("kvscope_ingest_batches_total")
    return [
        row("What arrives"),
        timeseries(
            "Events applied by type",
            [prom(_rate("kvscope_ingest_events_total", "replica, type"), "{{replica}} {{type}}")],
            description="BlockStored, BlockRemoved and AllBlocksCleared events applied.",
            unit="ops",
            min_value=0,
        ),
        timeseries(
            "Batches by status",
            [
                prom(applied, "{{replica}} applied"),
                prom(_rate("kvscope_ingest_duplicates_total"), "{{replica}} duplicate", "B"),
                # A stream that never refused anything has no malformed series at all: show 0.
                prom(f"{malformed} or 0 * {applied}", "{{replica}} malformed", "C"),
            ],
            description="Batches applied to the map, received twice and dropped, and refused "
            "as malformed.",
            unit="ops",
            min_value=0,
        ),
        timeseries(
            "Malformed input by kind",
            [
                prom(
                    f"sum by (replica, kind) (increase({kv('kvscope_ingest_malformed_total')}"
                    f"{{{REPLICAS}}}[{RATE}]))",
                    "{{replica}} {{kind}}",
                )
            ],
            description="Frames, payloads and events refused: frame_count, seq_length, "
            "seq_range, seq_back, oversize, undecodable_payload, unknown_event_type, "
            "bad_event, bad_replay. Empty while nothing was ever refused.",
            unit="short",
            min_value=0,
            custom={"drawStyle": "bars", "fillOpacity": 80, "lineWidth": 1},
        ),
        timeseries(
            "Messages that failed",
            [
                # A stream where nothing failed has no such series at all: show 0.
                prom(f"{_rate('kvscope_ingest_errors_total')} or 0 * {applied}", "{{replica}}")
            ],
            description="Messages whose handling raised (a bug in kvscope or its store hook, "
            "met by this input): each marked its stream's map unknown until the next clear, "
            "and the stream went on. kvscope_ingest_errors_total has the stage and the kind.",
            unit="ops",
            min_value=0,
        ),
        timeseries(
            "Last batch age",
            [
                prom(
                    "max by (replica, rank) "
                    f"({kv('kvscope_stream_last_batch_age_seconds')}{{{REPLICAS}}})",
                    "{{replica}}/{{rank}}",
                )
            ],
            description="Seconds since each stream's last batch arrived, on kvscope's clock. "
            "An idle engine publishes nothing, so a rising line is a quiet engine or a lost "
            "stream: the silent and connected panels tell which.",
            unit="s",
        ),
        timeseries(
            "Engine clock offset",
            [
                prom(
                    "max by (replica, rank) "
                    f"({kv('kvscope_stream_engine_clock_offset_seconds')}{{{REPLICAS}}})",
                    "{{replica}}/{{rank}}",
                )
            ],
            description="Each stream's last batch: arrival on kvscope's clock minus the "
            "engine's stamp. Transit time plus the clock difference between the hosts; a step "
            "is a clock that jumped, a slope a clock that drifts.",
            unit="s",
        ),
        timeseries(
            "Gaps, replays, restarts, clears",
            [
                prom(_rate("kvscope_ingest_gaps_total"), "{{replica}} gaps"),
                prom(
                    _rate("kvscope_ingest_replays_total", "replica, outcome"),
                    "{{replica}} replays {{outcome}}",
                    "B",
                ),
                prom(_rate("kvscope_ingest_restarts_total"), "{{replica}} restarts", "C"),
                prom(_rate("kvscope_ingest_clears_total"), "{{replica}} clears", "D"),
                prom(_rate("kvscope_ingest_tail_checks_total"), "{{replica}} tail checks", "E"),
            ],
            unit="ops",
            min_value=0,
        ),
    ]


def _store() -> list[Json]:
    seconds = f"rate({kv('kvscope_store_write_seconds_total')}[{RATE}])"
    transactions = f"rate({kv('kvscope_store_transactions_total')}[{RATE}])"
    return [
        row("The store"),
        timeseries(
            "Store queue",
            [
                prom(f"max({kv('kvscope_store_queue_rows')})", "rows waiting"),
                prom(f"max({kv('kvscope_store_spill_bytes')})", "spill file", "B"),
                prom(f"max({kv('kvscope_store_queue_bytes')})", "in memory", "C"),
            ],
            description="Rows waiting for the store's writer thread (in memory or spilled), the "
            "bytes of those held in memory (bounded by the store's queue_bytes), and the bytes "
            "waiting in the local spill file that takes the queue's overflow during an outage; "
            "only past the spill's cap are batches dropped (and the log marked incomplete). "
            "Resets are never dropped: past rare_bytes they wait on disk.",
            unit="short",
            min_value=0,
            w=8,
            overrides=[override("spill file", unit="bytes"), override("in memory", unit="bytes")],
        ),
        timeseries(
            "Store write latency",
            [
                prom(f"sum({seconds}) / sum({transactions})", "mean transaction"),
                prom(f"sum({seconds})", "busy share", "B"),
            ],
            description="Mean time per committed transaction, and the share of time the "
            "writer spends in transactions (100 % = always writing). Empty while idle.",
            unit="s",
            min_value=0,
            w=8,
            overrides=[override("busy share", unit="percentunit")],
        ),
        timeseries(
            "Transactions, retries, spilled rows, dropped batches, resets followed",
            [
                prom(f"sum({transactions})", "transactions"),
                prom(f"sum(rate({kv('kvscope_store_retries_total')}[{RATE}]))", "retries", "B"),
                prom(
                    f"sum(rate({kv('kvscope_store_spilled_rows_total')}[{RATE}]))",
                    "spilled rows",
                    "D",
                ),
                prom(
                    f"sum(rate({kv('kvscope_store_rare_spilled_rows_total')}[{RATE}]))",
                    "resets waiting on disk",
                    "F",
                ),
                prom(
                    f"sum(rate({kv('kvscope_store_rows_refused_total')}[{RATE}]))",
                    "refused rows",
                    "E",
                ),
                prom(
                    f"sum(rate({kv('kvscope_store_dropped_batches_total')}[{RATE}]))",
                    "dropped batches",
                    "C",
                ),
                prom(f"sum({kv('kvscope_store_reset_followers')})", "resets followed", "G"),
                prom(
                    f"sum(rate({kv('kvscope_store_reset_followers_turned_away_total')}[{RATE}]))",
                    "reset answers turned away",
                    "H",
                ),
                prom(
                    f"sum(rate({kv('kvscope_store_reset_groups_unreadable_total')}[{RATE}]))",
                    "reset groups unreadable",
                    "I",
                ),
            ],
            description="Resets followed: recovering resets the writer follows in memory; "
            "answers turned away: past `prefix_follower_bytes`, each computed from the store; "
            "groups unreadable: answers left without prefix groups, their log unreadable.",
            unit="ops",
            min_value=0,
            w=8,
            overrides=[override("resets followed", unit="short")],
        ),
    ]


def _leases() -> list[Json]:
    def per_second(name: str) -> str:
        return f"sum(rate({kv(name)}[{RATE}]))"

    return [
        row("Leases"),
        timeseries(
            "Leases: held per collector, takeovers, losses, fenced rows",
            [
                prom(f"sum by (instance) ({kv('kvscope_leases_held')})", "held: {{instance}}"),
                prom(per_second("kvscope_leases_takeovers_total"), "takeovers", "B"),
                prom(per_second("kvscope_leases_lost_total"), "lost", "C"),
                prom(per_second("kvscope_store_rows_fenced_total"), "fenced rows", "D"),
            ],
            description="Collectors that share streams through leases (`--lease`): the streams "
            "each holds (their sum is every stream, each held once), leases taken from a "
            "collector whose heartbeat stopped, leases a collector found taken from it, and "
            "rows left out at a write because their lease was gone. Empty without leases.",
            unit="short",
            min_value=0,
            w=24,
            overrides=[
                override("takeovers", unit="ops"),
                override("lost", unit="ops"),
                override("fenced rows", unit="ops"),
            ],
        ),
    ]


def build() -> Json:
    return dashboard(
        uid=COLLECTOR_HEALTH_UID,
        title="kvscope / Collector health",
        description="Streams connected, silent and degraded; events by type and status, "
        "malformed input, lag; the store's queue, write latency and retries; leases.",
        variables=[prometheus_variable(), replica_variable()],
        panels=[*_streams(), *_events(), *_store(), *_leases()],
        time_from="now-1h",
    )
