"""The store's single writer: batches, checkpoints, resets, intervals, rollups, off the ingest loop.

The ingest thread only builds small row objects and puts them on a bounded queue (hooks below);
one writer thread drains the queue into batched transactions. If the store is slow or down,
rows wait and are retried; if the queue overflows, dropped batches are counted and their
interval is written to the store as `incomplete` once it has room, followed by a fresh
checkpoint so that instants after the hole rebuild exactly again. Nothing is lost silently.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import ClearedMap
from kvscope.collector.snapshot import compress, encode_map, encode_tables
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    StreamId,
    TableKey,
)
from kvscope.collector.wire import table_key
from kvscope.storage import schema
from kvscope.storage.recovery import DEFAULT_OFFSETS_S, RecoveryPoint, RecoveryTracker
from kvscope.storage.rowqueue import RowQueue

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreSettings:
    queue_rows: int = 50_000
    """Batch, rollup and checkpoint rows that may wait for the store; past this they are
    dropped (counted; dropped batches are marked incomplete in the store). The rare rows
    (epochs, resets, recoveries, intervals) always wait: dropping them would lose what matters."""
    rows_per_transaction: int = 2_000
    checkpoint_log_ratio: float = 1.0
    """Checkpoint once the log written since the last checkpoint is this many times its size
    on disk.

    This bounds both costs: checkpoints take at most about as much disk as the log, and
    rebuilding an instant replays at most about one checkpoint's worth of log."""
    checkpoint_every_batches: int = 20_000
    """A checkpoint at least this often (in batches), whatever the sizes."""
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0
    recovery_offsets_s: tuple[float, ...] = DEFAULT_OFFSETS_S
    shard: str | None = None


# --- rows (built on the ingest thread; not frozen: frozen dataclasses are slow to build) -------
@dataclass(slots=True)
class _BatchRow:
    stream: StreamId
    epoch: int
    seq: int
    ts: float
    recv_ts: float
    payload: bytes


@dataclass(slots=True)
class _EpochRow:
    stream: StreamId
    epoch: int
    recv_ts: float


@dataclass(slots=True)
class _CheckpointRow:
    stream: StreamId
    epoch: int
    seq: int
    ts: float
    blocks: int
    snapshot: bytes


@dataclass(slots=True)
class _ResetRow:
    stream: StreamId
    key: tuple[int, int, str]
    """(epoch, seq, reason): the reset's identity in the store."""
    ts: float
    recv_ts: float | None
    degraded: bool
    before_blocks: int
    before_hittable: int
    before_orphans: int
    before_tokens: int
    before: bytes


@dataclass(slots=True)
class _RecoveryRow:
    stream: StreamId
    key: tuple[int, int, str]
    points: tuple[RecoveryPoint, ...]
    t50_s: float | None
    t90_s: float | None
    peak_orphans: int
    until_ts: float


@dataclass(slots=True)
class _IntervalRow:
    stream: StreamId
    kind: str
    epoch: int | None
    from_ts: float
    to_ts: float | None
    from_seq: int | None
    to_seq: int | None
    detail: str


@dataclass(slots=True)
class _RollupRow:
    stream: StreamId
    second: int
    medium: str
    group: int
    stored: int
    hittable: int
    orphans: int
    stores: int
    removes: int
    clears: int
    gaps: int


_Row = _BatchRow | _EpochRow | _CheckpointRow | _ResetRow | _RecoveryRow | _IntervalRow | _RollupRow


@dataclass
class _StreamState:
    """What the hooks remember per stream between batches (ingest thread only)."""

    epoch: int | None = None
    batches_since_checkpoint: int = 0
    log_bytes_since_checkpoint: int = 0
    last_checkpoint_bytes: int = 0
    """Size on disk of the last checkpoint (compressed), as the writer thread reports it."""
    checkpoint_seq: tuple[int, int] | None = None
    force_checkpoint: bool = False
    second: int | None = None
    events: dict[TableKey, list[int]] = field(default_factory=dict)
    """Blocks stored and removed per table in the current second."""
    clears: int = 0
    gaps: int = 0
    gaps_seen: int = 0
    connected_since: float | None = None
    degraded_done: int = 0
    """Intervals of the ingest's degraded_history written in their final form."""
    degraded_open_written: bool = False
    dropped_from: tuple[int, int, float] | None = None
    """(epoch, seq, ts) of the first batch dropped since the store last had room."""
    dropped_to: tuple[int, float] | None = None
    recoveries: list[tuple[tuple[int, int, str], RecoveryTracker]] = field(default_factory=list)


@dataclass
class WriterStats:
    rows_written: int = 0
    transactions: int = 0
    batches_dropped: int = 0
    retries: int = 0
    last_error: str | None = None
    write_seconds_total: float = 0.0


class ShardConflict(RuntimeError):
    """A stream is already written by another collector (another shard)."""


def claim_streams(engine: Engine, streams: list[StreamId], shard: str | None) -> None:
    """Record `shard` as the writer of `streams`, refusing streams another shard owns.

    Several collectors may share one PostgreSQL, each with its own replicas; two writers on one
    stream would interleave two logs, so that is refused before anything is written.
    """
    t = schema.streams
    with engine.begin() as conn:
        for stream in streams:
            row = conn.execute(
                select(t.c.id, t.c.shard).where(
                    t.c.replica == stream.replica, t.c.rank == stream.rank
                )
            ).first()
            if row is None:
                conn.execute(
                    insert(t).values(replica=stream.replica, rank=stream.rank, shard=shard)
                )
            elif row.shard not in (None, shard):
                raise ShardConflict(
                    f"{stream} is written by shard {row.shard!r}; this collector is "
                    f"{'unsharded' if shard is None else repr(shard)}"
                )
            elif row.shard is None and shard is not None:
                conn.execute(update(t).where(t.c.id == row.id).values(shard=shard))


class StoreWriter:
    """Map listener and batch hooks for a `Collector`, writing to one store."""

    def __init__(self, engine: Engine, settings: StoreSettings | None = None) -> None:
        self.engine = engine
        self.settings = settings or StoreSettings()
        self.stats = WriterStats()
        self._queue: RowQueue[_Row] = RowQueue(self.settings.queue_rows)
        self._streams: dict[StreamId, _StreamState] = {}
        self._stream_ids: dict[StreamId, int] = {}
        self._reset_ids: dict[tuple[StreamId, tuple[int, int, str]], int] = {}
        self._thread = threading.Thread(target=self._run, name="kvscope-store-writer", daemon=True)
        self._thread.start()

    # --- hooks (ingest thread) ----------------------------------------------------------------
    def before_batch(self, ingest: StreamIngest, batch: Batch) -> None:
        state = self._state(ingest.stream)
        for _, tracker in state.recoveries:
            tracker.before_batch(ingest.map, batch.ts)

    def after_batch(
        self, ingest: StreamIngest, batch: Batch, payload: bytes, recv_ts: float
    ) -> None:
        stream = ingest.stream
        state = self._state(stream)
        if state.epoch != ingest.epoch:
            state.epoch = ingest.epoch
            self._put_always(_EpochRow(stream, ingest.epoch, recv_ts))
        self._rollup(ingest, batch, state)
        if not self._put(_BatchRow(stream, ingest.epoch, batch.seq, batch.ts, recv_ts, payload)):
            self._note_drop(state, ingest.epoch, batch.seq, batch.ts)
        elif state.dropped_from is not None:
            self._close_drop(stream, state)
        self._track_degraded(ingest, state, recv_ts)
        self._follow_recoveries(ingest, batch, state)
        state.batches_since_checkpoint += 1
        state.log_bytes_since_checkpoint += len(payload)
        due = (
            state.force_checkpoint
            or state.log_bytes_since_checkpoint
            >= self.settings.checkpoint_log_ratio * state.last_checkpoint_bytes
            or state.batches_since_checkpoint >= self.settings.checkpoint_every_batches
        )
        if due and state.dropped_from is None:
            self._checkpoint(ingest, batch, state, recv_ts)

    def map_cleared(self, cleared: ClearedMap) -> None:
        state = self._state(cleared.stream)
        tables = cleared.tables
        key = (cleared.epoch, cleared.seq, cleared.reason.value)
        self._put_always(
            _ResetRow(
                stream=cleared.stream,
                key=key,
                ts=cleared.ts,
                recv_ts=cleared.recv_ts,
                degraded=cleared.degraded,
                before_blocks=sum(len(t) for t in tables.values()),
                before_hittable=sum(t.hittable_count for t in tables.values()),
                before_orphans=sum(t.orphan_count for t in tables.values()),
                before_tokens=sum(t.hittable_count * t.block_size for t in tables.values()),
                before=encode_tables(tables, compressed=False),
            )
        )
        # A new clear ends the recoveries still being followed on this stream.
        for old_key, tracker in state.recoveries:
            self._put_always(self._recovery_row(cleared.stream, old_key, tracker))
        state.recoveries = [
            (key, RecoveryTracker.start(cleared.ts, tables, self.settings.recovery_offsets_s))
        ]

    def connection_changed(self, stream: StreamId, connected: bool, ts: float) -> None:
        """A `Collector` connection observer: each connected stretch becomes an interval."""
        state = self._state(stream)
        if connected:
            state.connected_since = ts
            self._put_always(_IntervalRow(stream, "connected", None, ts, None, None, None, ""))
        elif state.connected_since is not None:
            since, state.connected_since = state.connected_since, None
            self._put_always(_IntervalRow(stream, "connected", None, since, ts, None, None, ""))

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (and the recoveries being followed), then stop the writer."""
        now = time.time()
        for stream, state in self._streams.items():
            if state.connected_since is not None:
                self.connection_changed(stream, False, now)
            for key, tracker in state.recoveries:
                self._put_always(self._recovery_row(stream, key, tracker))
            state.recoveries = []
        self._queue.close()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.error(
                "store still unreachable after %.0fs: %d rows not written (%s)",
                timeout,
                self._queue.pending,
                self.stats.last_error,
            )

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued row is written; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.pending == 0:
                return True
            time.sleep(0.01)
        return False

    @property
    def queue_depth(self) -> int:
        """Rows waiting for the store."""
        return self._queue.pending

    # --- ingest-thread helpers ----------------------------------------------------------------
    def _state(self, stream: StreamId) -> _StreamState:
        state = self._streams.get(stream)
        if state is None:
            state = self._streams[stream] = _StreamState()
        return state

    def _put(self, row: _Row) -> bool:
        """Queue a droppable row; False (dropped) when `queue_rows` of them already wait."""
        return self._queue.put(row, True)

    def _put_always(self, row: _Row) -> None:
        """Rare rows (resets, epochs, intervals) are never dropped and never block."""
        self._queue.put(row, False)

    def _note_drop(self, state: _StreamState, epoch: int, seq: int, ts: float) -> None:
        """Batch times (engine clock) bound the hole: instants are asked for in that clock."""
        self.stats.batches_dropped += 1
        if state.dropped_from is None:
            state.dropped_from = (epoch, seq, ts)
            logger.warning("store queue full: dropping batches from seq %d (counted)", seq)
        state.dropped_to = (seq, ts)
        state.force_checkpoint = True

    def _close_drop(self, stream: StreamId, state: _StreamState) -> None:
        assert state.dropped_from is not None and state.dropped_to is not None
        epoch, from_seq, from_ts = state.dropped_from
        to_seq, to_ts = state.dropped_to
        self._put_always(
            _IntervalRow(
                stream,
                "incomplete",
                epoch,
                from_ts,
                to_ts,
                from_seq,
                to_seq,
                f"store queue overflow: {to_seq - from_seq + 1} batches not stored",
            )
        )
        state.dropped_from = state.dropped_to = None

    def _checkpoint(
        self, ingest: StreamIngest, batch: Batch, state: _StreamState, recv_ts: float
    ) -> None:
        row = _CheckpointRow(
            ingest.stream,
            ingest.epoch,
            batch.seq,
            batch.ts,
            ingest.map.totals().blocks,
            encode_map(ingest.map, compressed=False),
        )
        if self._put(row):
            state.batches_since_checkpoint = 0
            state.log_bytes_since_checkpoint = 0
            # Until the writer reports the size on disk, assume zstd's usual 40 %.
            state.last_checkpoint_bytes = len(row.snapshot) * 2 // 5
            state.checkpoint_seq = (row.epoch, row.seq)
            state.force_checkpoint = False

    def _track_degraded(self, ingest: StreamIngest, state: _StreamState, recv_ts: float) -> None:
        """Write each degraded interval when first seen, and again (an upsert) when it closes."""
        history = ingest.degraded_history
        while state.degraded_done < len(history):
            interval = history[state.degraded_done]
            closed = interval.cleared_at is not None  # set by a clear or by a restart
            if closed or not state.degraded_open_written:
                self._put_always(
                    _IntervalRow(
                        ingest.stream,
                        "degraded",
                        interval.epoch,
                        interval.since,
                        interval.cleared_at,
                        interval.from_seq,
                        interval.cleared_at_seq,
                        f"{interval.reason} (seq {interval.from_seq}..{interval.to_seq} missing)",
                    )
                )
            if not closed:
                state.degraded_open_written = True
                return
            state.degraded_done += 1
            state.degraded_open_written = False

    def _rollup(self, ingest: StreamIngest, batch: Batch, state: _StreamState) -> None:
        second = int(batch.ts)
        if state.second is not None and second != state.second:
            self._flush_rollup(ingest, state)
        state.second = second
        per_table = state.events
        for event in batch.events:
            if type(event) is BlocksStored:
                counts = per_table.get(event.table)
                if counts is None:
                    counts = per_table[event.table] = [0, 0]
                counts[0] += len(event.hashes)
            elif type(event) is BlocksRemoved:
                counts = per_table.get(event.table)
                if counts is None:
                    counts = per_table[event.table] = [0, 0]
                counts[1] += len(event.hashes)
            elif type(event) is AllCleared:
                state.clears += 1
        state.gaps += ingest.counters.gaps - state.gaps_seen
        state.gaps_seen = ingest.counters.gaps

    def _flush_rollup(self, ingest: StreamIngest, state: _StreamState) -> None:
        """The second that just ended: the map as it stood after its last batch.

        Stores and removes are per table; clears and gaps belong to the stream and are
        repeated on each of its rows (take the max over tiers, not the sum)."""
        assert state.second is not None
        stats = ingest.map.stats()
        keys = set(stats) | set(state.events) or {table_key("GPU", 0)}
        for key in keys:
            s = stats.get(key)
            stores, removes = state.events.get(key, (0, 0))
            self._put(
                _RollupRow(
                    ingest.stream,
                    state.second,
                    key.medium,
                    key.group,
                    0 if s is None else s.blocks,
                    0 if s is None else s.hittable,
                    0 if s is None else s.orphans,
                    stores,
                    removes,
                    state.clears,
                    state.gaps,
                )
            )
        state.events = {}
        state.clears = state.gaps = 0

    def _follow_recoveries(self, ingest: StreamIngest, batch: Batch, state: _StreamState) -> None:
        still = []
        for key, tracker in state.recoveries:
            if batch.seq == key[1] and ingest.epoch == key[0]:
                still.append((key, tracker))  # the batch that carried the clear itself
                continue
            tracker.after_batch(ingest.map, batch.ts)
            if tracker.done:
                self._put_always(self._recovery_row(ingest.stream, key, tracker))
            else:
                still.append((key, tracker))
        state.recoveries = still

    @staticmethod
    def _recovery_row(
        stream: StreamId, key: tuple[int, int, str], tracker: RecoveryTracker
    ) -> _RecoveryRow:
        s = tracker.summary()
        return _RecoveryRow(
            stream, key, tuple(tracker.points), s.t50_s, s.t90_s, s.peak_orphans, s.until_ts
        )

    # --- the writer thread --------------------------------------------------------------------
    def _run(self) -> None:
        backoff = self.settings.retry_initial_s
        while (taken := self._queue.take(self.settings.rows_per_transaction)) is not None:
            rows = [row for row, _ in taken]
            while True:
                started = time.perf_counter()
                try:
                    with self.engine.begin() as conn:
                        self._write(conn, rows)
                    break
                except SQLAlchemyError as exc:
                    self.stats.retries += 1
                    self.stats.last_error = str(exc).splitlines()[0]
                    logger.warning(
                        "store write failed (%s); retrying in %.1fs",
                        self.stats.last_error,
                        backoff,
                    )
                    self._forget_ids()
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.settings.retry_max_s)
            self.stats.write_seconds_total += time.perf_counter() - started
            self.stats.rows_written += len(rows)
            self.stats.transactions += 1
            self._queue.done(taken)
            backoff = self.settings.retry_initial_s

    def _forget_ids(self) -> None:
        """A failed transaction may have rolled back ids we cached within it."""
        self._stream_ids.clear()
        self._reset_ids.clear()

    def _stream_id(self, conn: Connection, stream: StreamId) -> int:
        sid = self._stream_ids.get(stream)
        if sid is None:
            t = schema.streams
            found = conn.execute(
                select(t.c.id).where(t.c.replica == stream.replica, t.c.rank == stream.rank)
            ).scalar_one_or_none()
            if found is None:
                found = conn.execute(
                    insert(t)
                    .values(replica=stream.replica, rank=stream.rank, shard=self.settings.shard)
                    .returning(t.c.id)
                ).scalar_one()
            sid = self._stream_ids[stream] = int(found)
        return sid

    def _write(self, conn: Connection, rows: list[_Row]) -> None:
        groups: dict[type, list[dict[str, Any]]] = {}
        ordered: list[_Row] = []
        for row in rows:
            if type(row) is _BatchRow:
                groups.setdefault(_BatchRow, []).append(
                    {
                        "stream_id": self._stream_id(conn, row.stream),
                        "epoch": row.epoch,
                        "seq": row.seq,
                        "ts": row.ts,
                        "recv_ts": row.recv_ts,
                        "payload": row.payload,
                    }
                )
            elif type(row) is _RollupRow:
                groups.setdefault(_RollupRow, []).append(
                    {
                        "stream_id": self._stream_id(conn, row.stream),
                        "second": row.second,
                        "medium": row.medium,
                        "grp": row.group,
                        "stored": row.stored,
                        "hittable": row.hittable,
                        "orphans": row.orphans,
                        "stores": row.stores,
                        "removes": row.removes,
                        "clears": row.clears,
                        "gaps": row.gaps,
                    }
                )
            else:
                ordered.append(row)
        # Epochs, resets and recoveries keep their order (a recovery needs its reset's id).
        for row in ordered:
            self._write_one(conn, row)
        if _BatchRow in groups:
            conn.execute(insert(schema.batches), groups[_BatchRow])
        if _RollupRow in groups:
            self._upsert_rollups(conn, groups[_RollupRow])

    def _upsert_rollups(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """One statement for them all. A second can come twice (its batches straddle a
        restart, or a resumed collector goes over it again): the last one wins."""
        t = schema.rollups
        dialect = conn.dialect.name
        upsert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(t)
        keys = ("stream_id", "second", "medium", "grp")
        statement = upsert.on_conflict_do_update(
            index_elements=[t.c[k] for k in keys],
            set_={c.name: upsert.excluded[c.name] for c in t.columns if c.name not in keys},
        )
        latest = {tuple(row[k] for k in keys): row for row in rows}  # one row per key
        conn.execute(statement, list(latest.values()))

    def _write_one(self, conn: Connection, row: _Row) -> None:
        if type(row) is _EpochRow:
            t = schema.epochs
            sid = self._stream_id(conn, row.stream)
            exists = conn.execute(
                select(t.c.epoch).where(t.c.stream_id == sid, t.c.epoch == row.epoch)
            ).first()
            if exists is None:
                conn.execute(
                    insert(t).values(stream_id=sid, epoch=row.epoch, started_recv_ts=row.recv_ts)
                )
        elif type(row) is _CheckpointRow:
            conn.execute(
                insert(schema.checkpoints).values(
                    stream_id=self._stream_id(conn, row.stream),
                    epoch=row.epoch,
                    seq=row.seq,
                    ts=row.ts,
                    blocks=row.blocks,
                    snapshot=self._compressed_checkpoint(row),
                )
            )
        elif type(row) is _ResetRow:
            epoch, seq, reason = row.key
            reset_id = conn.execute(
                insert(schema.resets)
                .values(
                    stream_id=self._stream_id(conn, row.stream),
                    epoch=epoch,
                    seq=seq,
                    ts=row.ts,
                    recv_ts=row.recv_ts,
                    reason=reason,
                    degraded=row.degraded,
                    before_blocks=row.before_blocks,
                    before_hittable=row.before_hittable,
                    before_orphans=row.before_orphans,
                    before_tokens=row.before_tokens,
                    before=compress(row.before),
                )
                .returning(schema.resets.c.id)
            ).scalar_one()
            self._reset_ids[(row.stream, row.key)] = int(reset_id)
        elif type(row) is _RecoveryRow:
            reset_id = self._reset_id(conn, row.stream, row.key)
            t = schema.resets
            conn.execute(
                update(t)
                .where(t.c.id == reset_id)
                .values(
                    t50_s=row.t50_s,
                    t90_s=row.t90_s,
                    peak_orphans=row.peak_orphans,
                    recovery_until_ts=row.until_ts,
                )
            )
            if row.points:
                conn.execute(
                    insert(schema.reset_recovery),
                    [
                        {
                            "reset_id": reset_id,
                            "offset_s": p.offset_s,
                            "blocks": p.blocks,
                            "hittable": p.hittable,
                            "orphans": p.orphans,
                            "share_blocks_back": p.share_blocks_back,
                            "share_tokens_back": p.share_tokens_back,
                        }
                        for p in row.points
                    ],
                )
        elif type(row) is _IntervalRow:
            t = schema.intervals
            sid = self._stream_id(conn, row.stream)
            values = {
                "stream_id": sid,
                "kind": row.kind,
                "epoch": row.epoch,
                "from_ts": row.from_ts,
                "to_ts": row.to_ts,
                "from_seq": row.from_seq,
                "to_seq": row.to_seq,
                "detail": row.detail,
            }
            # An interval is written when it opens and again when it closes.
            same = (
                (t.c.stream_id == sid)
                & (t.c.kind == row.kind)
                & (t.c.from_ts == row.from_ts)
                & (t.c.from_seq == row.from_seq)
            )
            if conn.execute(update(t).where(same).values(**values)).rowcount == 0:
                conn.execute(insert(t).values(**values))

    def _compressed_checkpoint(self, row: _CheckpointRow) -> bytes:
        packed = compress(row.snapshot)
        state = self._streams.get(row.stream)
        if state is not None and state.checkpoint_seq == (row.epoch, row.seq):
            state.last_checkpoint_bytes = len(packed)  # one int, read by the ingest thread
        return packed

    def _reset_id(self, conn: Connection, stream: StreamId, key: tuple[int, int, str]) -> int:
        cached = self._reset_ids.get((stream, key))
        if cached is not None:
            return cached
        t = schema.resets
        epoch, seq, reason = key
        found = conn.execute(
            select(t.c.id).where(
                t.c.stream_id == self._stream_id(conn, stream),
                t.c.epoch == epoch,
                t.c.seq == seq,
                t.c.reason == reason,
            )
        ).scalar_one()
        return int(found)
