"""The store's tables (SQLAlchemy Core). Migrations in `migrations/` create exactly these.

Times are Unix seconds as floats: `ts` is the engine's batch timestamp (what "the map at an
instant" means), `recv_ts` the collector's wall clock when the batch arrived.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

metadata = MetaData()

streams = Table(
    "streams",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("replica", String(200), nullable=False),
    Column("rank", Integer, nullable=False),
    # The collector process that writes this stream (several may share one PostgreSQL).
    Column("shard", String(200)),
    UniqueConstraint("replica", "rank", name="uq_streams_replica_rank"),
)

epochs = Table(
    "epochs",
    metadata,
    Column("stream_id", Integer, ForeignKey("streams.id"), primary_key=True),
    Column("epoch", Integer, primary_key=True),
    Column("started_recv_ts", Float, nullable=False),
)

log_chunks = Table(
    "log_chunks",
    metadata,
    # The log that rebuilds any instant: every KVEventBatch exactly as received, with its seq,
    # engine ts and receive time, in runs of one epoch's consecutive batches (storage/log_chunks).
    Column("stream_id", Integer, ForeignKey("streams.id"), primary_key=True),
    Column("epoch", Integer, primary_key=True),
    Column("first_seq", BigInteger, primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
    # Engine time of the chunk's earliest and latest batch (at most MAX_CHUNK_SPAN_S apart).
    Column("min_ts", Float, nullable=False),
    Column("max_ts", Float, nullable=False),
    Column("batches", Integer, nullable=False),
    # Size before compression.
    Column("raw_bytes", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    # Collector time of the chunk's earliest and latest batch (not ordered as seqs are: a
    # replayed batch arrives late); NULL in chunks an older kvscope wrote, until backfilled.
    Column("min_recv_ts", Float),
    Column("max_recv_ts", Float),
    # The digest of the log_dictionaries row `data` is compressed against (format 2), if any.
    Column("dictionary", LargeBinary),
    # The seq of the checkpoint (of the chunk's epoch) whose hashes `data` names (format 6), if
    # any: retention keeps it while the chunk stays, without reading chunks' bytes.
    Column("known_seq", BigInteger),
    Index("ix_log_chunks_stream_min_ts", "stream_id", "min_ts"),
    Index("ix_log_chunks_stream_max_ts", "stream_id", "max_ts"),
    Index("ix_log_chunks_stream_recv_ts", "stream_id", "max_recv_ts", "min_recv_ts"),
    Index("ix_log_chunks_stream_dictionary", "stream_id", "dictionary"),
    Index("ix_log_chunks_stream_known", "stream_id", "epoch", "known_seq"),
)

log_dictionaries = Table(
    "log_dictionaries",
    metadata,
    # A stream's token content that its log chunks are compressed against
    # (storage/log_dictionary.py), stored once under its content's digest.
    Column("stream_id", Integer, ForeignKey("streams.id"), primary_key=True),
    Column("digest", LargeBinary, primary_key=True),
    # When the writer made it (its clock): retention keeps each stream's newest.
    Column("made_at", Float, nullable=False),
    Column("raw_bytes", Integer, nullable=False),
    # The content, zstd-compressed.
    Column("data", LargeBinary, nullable=False),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("stream_id", Integer, ForeignKey("streams.id"), primary_key=True),
    Column("epoch", Integer, primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("ts", Float, nullable=False),
    Column("blocks", Integer, nullable=False),
    Column("snapshot", LargeBinary, nullable=False),
    # A delta checkpoint (snapshot format 4) is read with the key checkpoint at this seq of
    # the same stream and epoch; null for a key.
    Column("key_seq", BigInteger, nullable=True),
    # The digest of the log dictionary whose blocks the snapshot numbers (its header names it),
    # if any: retention keeps that dictionary while this stays, without reading snapshots.
    Column("dictionary", LargeBinary),
    Index("ix_checkpoints_ts", "ts"),
    Index("ix_checkpoints_stream_dictionary", "stream_id", "dictionary"),
)

resets = Table(
    "resets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stream_id", Integer, ForeignKey("streams.id"), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("ts", Float, nullable=False),
    # The collector's wall clock when the clear arrived: reset requests are linked by it.
    Column("recv_ts", Float),
    # all_blocks_cleared (the engine emptied its cache) or restart.
    Column("reason", String(40), nullable=False),
    # The map was known to be incomplete when it was emptied.
    Column("degraded", Boolean, nullable=False),
    # default / preempt / keep, when the reset was triggered through kvscope.
    Column("mode", String(20)),
    Column("before_blocks", Integer, nullable=False),
    Column("before_hittable", Integer, nullable=False),
    Column("before_orphans", Integer, nullable=False),
    Column("before_tokens", BigInteger, nullable=False),
    # The full map just before the clear (a map snapshot).
    Column("before", LargeBinary, nullable=False),
    # Seconds until the map held 50 % / 90 % of its pre-reset block count again.
    Column("t50_s", Float),
    Column("t90_s", Float),
    # Most orphans (blocks whose parent is not cached) seen during recovery: keep-running
    # resets make them.
    Column("peak_orphans", Integer),
    # Recovery was followed up to here (the window's end, the next reset, or the last batch).
    Column("recovery_until_ts", Float),
    # Every offset of the window was reached; false while it is followed (the points reached so
    # far are stored as they are) or when a later reset or the stream's end cut it short.
    Column("recovery_complete", Boolean),
    # Tokens of the pre-reset blocks cached again at the last offset reached (computed twice),
    # and the orphans the reset left (storage/reset_prefixes.py; stored with its prefix groups).
    Column("tokens_recomputed", BigInteger),
    Column("orphans_left", Integer),
    Index("ix_resets_stream_ts", "stream_id", "ts"),
    UniqueConstraint("stream_id", "epoch", "seq", "reason", name="uq_resets_event"),
)

reset_recovery = Table(
    "reset_recovery",
    metadata,
    Column("reset_id", Integer, ForeignKey("resets.id"), primary_key=True),
    Column("offset_s", Float, primary_key=True),
    Column("blocks", Integer, nullable=False),
    Column("hittable", Integer, nullable=False),
    Column("orphans", Integer, nullable=False),
    # Share of the pre-reset blocks cached again.
    Column("share_blocks_back", Float, nullable=False),
    # Share of the pre-reset prefixes, counted in tokens of hittable blocks, cached again.
    Column("share_tokens_back", Float, nullable=False),
)

reset_prefix_groups = Table(
    "reset_prefix_groups",
    metadata,
    # storage/reset_prefixes.py's groups of a reset as of the offsets reached, stored with each
    # recovery row (the rule needs the map rebuilt from the log, which SQL cannot do).
    Column("reset_id", Integer, ForeignKey("resets.id"), primary_key=True),
    # Largest first, as reset_prefixes orders them.
    Column("position", Integer, primary_key=True),
    Column("medium", String(40), nullable=False),
    Column("kv_group", Integer, nullable=False),
    # The root hash in hex (a 64-bit unsigned hash does not fit BigInteger).
    Column("root", String(40), nullable=False),
    Column("blocks", Integer, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("shared_blocks", Integer, nullable=False),
    Column("back_at_s", Float),
    Column("status", String(20), nullable=False),
    # The root's first token ids, space-separated (NULL: the publisher sent none).
    Column("first_tokens", String(400)),
)

intervals = Table(
    "intervals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stream_id", Integer, ForeignKey("streams.id"), nullable=False),
    # degraded (the map is incomplete), incomplete (the store dropped batches), connected.
    Column("kind", String(20), nullable=False),
    Column("epoch", Integer),
    Column("from_ts", Float, nullable=False),
    Column("to_ts", Float),
    Column("from_seq", BigInteger),
    Column("to_seq", BigInteger),
    Column("detail", String(400)),
    Index("ix_intervals_stream_kind", "stream_id", "kind"),
)

rollups = Table(
    "rollups",
    metadata,
    Column("stream_id", Integer, ForeignKey("streams.id"), primary_key=True),
    Column("second", BigInteger, primary_key=True),
    Column("medium", String(16), primary_key=True),
    Column("grp", Integer, primary_key=True),
    Column("stored", Integer, nullable=False),
    Column("hittable", Integer, nullable=False),
    Column("orphans", Integer, nullable=False),
    # Blocks stored and removed in this tier during the second.
    Column("stores", Integer, nullable=False),
    Column("removes", Integer, nullable=False),
    # Clears and gaps belong to the stream: the same on each of its tier rows.
    Column("clears", Integer, nullable=False),
    Column("gaps", Integer, nullable=False),
    Index("ix_rollups_second", "second"),
)

engine_samples = Table(
    "engine_samples",
    metadata,
    # What the engine itself reports on its Prometheus /metrics, scraped every few seconds
    # (storage/scrape.py). Counters are cumulative as exposed; readers take deltas.
    Column("replica", String(200), primary_key=True),
    # vLLM's `engine` label: the data-parallel rank ("0" where the server labels none).
    Column("engine", String(50), primary_key=True),
    # When the scrape was answered, on the clock of the replica's batches, which readers
    # compare with reset times: the collector's wall clock for a real server (vLLM stamps
    # batches with its host's time.time(); they differ by the hosts' skew), the lab's
    # simulated clock in `kvscope demo --source lab` (at any speed).
    Column("ts", Float, primary_key=True),
    # A figure the server did not expose is NULL.
    Column("prefix_cache_queries", Float),
    Column("prefix_cache_hits", Float),
    Column("preemptions", Float),
    Column("running", Float),
    Column("waiting", Float),
    # vLLM's kv_cache_usage_perc: a fraction (0..1) despite its name.
    Column("kv_usage", Float),
    Column("ttft_sum", Float),
    Column("ttft_count", Float),
    # msgpack of [[le, cumulative count], ...] sorted by le (the last le is +inf).
    Column("ttft_buckets", LargeBinary),
)

reset_requests = Table(
    "reset_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("replica", String(200), nullable=False),
    # Wall-clock time of the request: the AllBlocksCleared that follows is linked by time.
    Column("requested_at", Float, nullable=False),
    Column("requested_by", String(200), nullable=False),
    # default / preempt / keep
    Column("mode", String(20), nullable=False),
    Column("external", Boolean, nullable=False),
    # success / refused (vLLM said success false) / http_error / timeout / unreachable
    Column("outcome", String(20), nullable=False),
    Column("http_status", Integer),
    Column("detail", String(400)),
    Index("ix_reset_requests_replica_at", "replica", "requested_at"),
)

lease_members = Table(
    "lease_members",
    metadata,
    # A running `collect --lease` process (storage/leases.py): alive while `expires_at`, renewed
    # by its heartbeat on the database's clock, is in the future. Its leases last as long.
    Column("id", String(200), primary_key=True),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

stream_leases = Table(
    "stream_leases",
    metadata,
    # The one writer of a stream: `owner` (a lease member's id, NULL once released) holds it
    # under `token`, which grows by one at every grant; each write checks both (fencing).
    Column("replica", String(200), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("owner", String(200)),
    Column("token", BigInteger, nullable=False),
)

lease_grants = Table(
    "lease_grants",
    metadata,
    # Every grant of a stream's lease, and when its holder's writes landed (the database's
    # clock, at each write transaction): who wrote a stream when, and that no two did at once.
    Column("replica", String(200), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("token", BigInteger, primary_key=True),
    Column("owner", String(200), nullable=False),
    # Taken from a holder whose heartbeat had stopped (not released to it).
    Column("takeover", Boolean, nullable=False),
    Column("granted_at", DateTime(timezone=True), nullable=False),
    Column("released_at", DateTime(timezone=True)),
    Column("first_write_at", DateTime(timezone=True)),
    Column("last_write_at", DateTime(timezone=True)),
    Column("writes", BigInteger, nullable=False),
)
