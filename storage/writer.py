"""The store's single writer: batches, checkpoints, resets, intervals, rollups, off the ingest loop.

The writer is the collector's `EventSink` (collector/sink.py). On the ingest thread it only
builds small row objects and puts them on a bounded queue (per batch a tuple for the log and a
few counter updates; rollups keep each batch's per-table changes, checkpoints copy the map as it
is); one writer thread drains the queue into batched transactions, packing the log into
compressed chunks (storage/log_chunks) and encoding and compressing the copied maps. If the
store is slow or down, rows wait and are retried; if the queue overflows, dropped batches are
counted and their interval is written to the store as `incomplete` once it has room, followed by
a fresh checkpoint so that instants after the hole rebuild exactly again. Nothing is lost
silently.
"""

from __future__ import annotations

import logging
import math
import sys
import time

from sqlalchemy import Engine

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.sink import (
    AppliedBatch,
    ClearedMap,
    ClearReason,
    ConnectionChange,
    DegradedChange,
    DegradedStep,
    MapReader,
    ResumePoint,
    Span,
)
from kvscope.collector.snapshot import copy_map
from kvscope.collector.types import StreamId
from kvscope.storage._checkpoint_pacing import CheckpointPacer
from kvscope.storage._store_sink import StoreSinkCore
from kvscope.storage.checkpoint_deltas import CheckpointEncoder
from kvscope.storage.gc_policy import raise_young_threshold
from kvscope.storage.heap_trim import pin_thresholds
from kvscope.storage.leases import Fence
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.prefix_followers import PrefixFollowers
from kvscope.storage.recovery_follow import StreamRecoveries, recovery_row
from kvscope.storage.recovery_resume import open_recovery
from kvscope.storage.rollups import SecondRollup
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.rows import (
    BeforeMap,
    CheckpointRow,
    IntervalRow,
    RecoveryRow,
    ResetRow,
    Row,
)
from kvscope.storage.spill import Spill
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.write_loop import WriteLoop
from kvscope.storage.writer_state import StreamState, WriterStats

logger = logging.getLogger(__name__)


class StoreWriter(StoreSinkCore):
    """A `Collector`'s sink (collector/sink.py's `EventSink`), writing to one store."""

    def __init__(
        self, engine: Engine, settings: StoreSettings | None = None, fence: Fence | None = None
    ) -> None:
        self.settings = settings or StoreSettings()
        self.stats = WriterStats()
        self._drop_log = RateLimitedLog(logger)
        self._spill: Spill[Row] | None = (
            Spill(self.settings.spill_bytes, self.settings.spill_dir)
            if self.settings.spill_bytes > 0
            else None
        )
        self._queue = RowQueue(
            self.settings.queue_rows,
            linger_s=self.settings.linger_s,
            spill=self._spill,
            bytes_limit=self.settings.queue_bytes,
            rare_bytes_limit=self.settings.rare_bytes,
        )
        self.fence = fence  # with leases: the streams held, and the lease counters
        self._sql = RowWriter(
            self.settings.shard,
            PrefixFollowers(
                self.settings.prefix_followers, follow_bytes=self.settings.prefix_follower_bytes
            ),
            fence,
            LogPacker(
                self.settings.log_dictionary_bytes,
                self.settings.log_dictionary_ratio,
                self.settings.log_chunk_format,
            ),
            CheckpointEncoder(self.settings.checkpoint_delta_share),
        )
        switch = self.settings.gil_switch_interval_s
        if switch is not None and switch < sys.getswitchinterval():
            sys.setswitchinterval(switch)
        raise_young_threshold(self.settings.gc_young_threshold)
        # The writer thread's large blocks go back to the OS once freed (storage/heap_trim.py).
        pin_thresholds()
        self._loop = WriteLoop(engine, self._queue, self._sql, self.settings, self.stats)
        self._thread = self._loop.thread

    # --- the sink (ingest thread) -------------------------------------------------------------
    # `applied`, each batch, is the base's (storage/_store_sink.pyx), in C: it calls `_state`,
    # `_put_always`, `_note_drop`, `_close_drop` and `_checkpoint` below when there is more to
    # do than count the batch and queue its row. `instant`, at each second's end, is the base's
    # too: it calls `_instant_followed` while a recovery is followed.

    def _instant_followed(
        self, state: StreamState, stream: StreamId, ts: float, view: MapReader
    ) -> Span:
        """`instant` while the stream's recoveries are followed."""
        # Each point is queued as soon as the stream passes its offset.
        for recovery in state.recoveries.before_batch(view, ts):
            self._put_always(recovery)
        for row in state.rollup.instant(view, ts):
            self._queue.put_batch(row, 0)  # (`_put`, without its calls)
        span = state.rollup.span()
        if not state.recoveries.followed:
            return span
        for at in state.recoveries.next_instants():
            # A batch stamped past `at` must come after a call.
            span = span.within(Span(-math.inf, math.nextafter(at, math.inf)))
        return span

    def map_cleared(self, cleared: ClearedMap) -> None:
        state = self._state(cleared.stream)
        if cleared.reason is ClearReason.ALL_BLOCKS_CLEARED:
            state.rollup.cleared()
        tables = cleared.tables
        key = (cleared.epoch, cleared.seq, cleared.reason.value)
        # Handed over, not copied: the map starts from new tables, and these never change again.
        before = BeforeMap(tables, cleared.signed_hashes)
        self._put_always(
            ResetRow(
                stream=cleared.stream,
                key=key,
                ts=cleared.ts,
                recv_ts=cleared.recv_ts,
                degraded=cleared.degraded,
                before_blocks=sum(len(t) for t in tables.values()),
                before_hittable=sum(t.hittable_count for t in tables.values()),
                before_orphans=sum(t.orphan_count for t in tables.values()),
                before_tokens=sum(t.hittable_count * t.block_size for t in tables.values()),
                before=before,
            ),
            before.nbytes,
        )
        # A new clear ends the recoveries still being followed on this stream.
        for row in state.recoveries.cleared(key, cleared.ts, tables):
            self._put_always(row)

    def resumed(self, point: ResumePoint) -> None:
        """The stream resumes at `point` (after a crash): the recovery window the store left
        open is followed on, as if nothing had stopped. Call before the stream's next batch."""
        found = open_recovery(self.engine, point, self.settings.recovery_offsets_s)
        if found is None:
            return
        state = self._state(point.stream)
        if found.stored_behind:
            self._put_always(recovery_row(point.stream, found.key, found.tracker))
        if not found.tracker.done:
            state.recoveries.resumed(found.key, found.tracker)

    def forget(self, stream: StreamId) -> None:
        """The stream left this collector (its lease given up or lost): its state goes, as in
        a crash; its next holder resumes from the store (`fence`: storage/leases.py). The
        writer thread's state of it goes once what it queued is written."""
        self._forget_state(stream)
        self._loop.forget(stream)

    def degraded(self, change: DegradedChange) -> None:
        """Each degraded interval is written when it opens and again (an upsert on its start)
        when it closes, with the seqs found missing meanwhile; not at each widening, which a
        broken stream may do at every batch."""
        if change.step is DegradedStep.WIDENED:
            return
        self._put_always(
            IntervalRow(
                change.stream,
                "degraded",
                change.epoch,
                change.since,
                change.cleared_at,
                change.from_seq,
                change.cleared_at_seq,
                f"{change.reason} (seq {change.from_seq}..{change.to_seq} missing)",
            )
        )

    def connection(self, change: ConnectionChange) -> None:
        """Each connected stretch becomes an interval."""
        self._connection_changed(change.stream, change.connected, change.ts)

    def _connection_changed(self, stream: StreamId, connected: bool, ts: float) -> None:
        state = self._state(stream)
        if connected:
            state.connected_since = ts
            self._put_always(IntervalRow(stream, "connected", None, ts, None, None, None, ""))
        elif state.connected_since is not None:
            since, state.connected_since = state.connected_since, None
            self._put_always(IntervalRow(stream, "connected", None, since, ts, None, None, ""))

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (and the recoveries being followed), then stop the writer."""
        now = time.time()
        for stream, state in self._streams.items():
            if state.dropped_from is not None:
                self._close_drop(stream, state)  # a hole up to the end is a hole too
            for row in state.rollup.close():
                self._put(row)
            if state.connected_since is not None:
                self._connection_changed(stream, False, now)
            for recovery in state.recoveries.close():
                self._put_always(recovery)
        self._queue.close()
        self._thread.join(timeout)
        if self._spill is not None and not self._thread.is_alive():
            self._spill.close()
        if self._thread.is_alive():
            logger.error(
                "store still unreachable after %.0fs: %d rows not written (%s)",
                timeout,
                self._queue.pending,
                self.stats.last_error,
            )

    def flush(self, timeout: float = 30.0, idle_work: bool = False) -> bool:
        """Wait until every row queued before this call is written (rows queued meanwhile may
        wait); False on timeout or when the writer has stopped. A reader of the store that
        must not miss the latest batches calls this first: the writer lingers up to
        `linger_s`. With `idle_work`, also until the work the writer does while it waits for
        rows is done (storage/log_repack.py, storage/free_pages.py): the store as compact as
        it gets, which rows queued meanwhile put off (False if a failed step put it off
        until the next rows)."""
        mark = self._queue.put_total
        deadline = time.monotonic() + timeout
        while self._queue.written_total < mark or (idle_work and self._loop.idle_work):
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            self._queue.hurry()
            time.sleep(0.005)
        return not (idle_work and self._loop.idle_put_off)

    @property
    def engine(self) -> Engine:
        """The store written to (the writer thread's: replacing it redirects the writes)."""
        return self._loop.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._loop.engine = engine

    @property
    def failure(self) -> str | None:
        """Why the writer thread stopped by itself, if it did: nothing more is stored."""
        return self._loop.failure

    @property
    def up(self) -> bool:
        """The writer thread runs, or ended because it was closed."""
        return self.failure is None and (self._thread.is_alive() or self._queue.closed)

    @property
    def queue_depth(self) -> int:
        """Rows waiting for the store (in memory or spilled)."""
        return self._queue.pending

    @property
    def spilled_rows_total(self) -> int:
        return 0 if self._spill is None else self._spill.rows_total

    @property
    def memory_bytes(self) -> int:
        """Bytes of the rows waiting in memory (payloads, map snapshots)."""
        return self._queue.memory_bytes

    @property
    def rare_spilled_total(self) -> int:
        return self._queue.rare_spilled_total

    @property
    def reset_followers(self) -> tuple[int, int, int]:
        """Recovering resets followed in memory, answers turned away for want of room
        (storage/prefix_followers.py), and answers left without groups because their log
        cannot be read; read from another thread, as the other counts."""
        followers = self._sql.followers
        return followers.held(), followers.turned_away, self._sql.groups_unreadable

    @property
    def spill_bytes(self) -> int:
        """Bytes of rows waiting in the spill file."""
        return 0 if self._spill is None else self._spill.bytes_held

    # --- ingest-thread helpers ----------------------------------------------------------------
    def _state(self, stream: StreamId) -> StreamState:
        state = self._streams.get(stream)
        if state is None:
            recoveries = StreamRecoveries(stream, self.settings.recovery_offsets_s)
            pacer = CheckpointPacer(
                self.settings.checkpoint_events_per_block,
                self.settings.checkpoint_every_batches,
                self.settings.checkpoint_min_blocks,
            )
            state = self._streams[stream] = StreamState(SecondRollup(stream), recoveries, pacer)
        return state

    def _put(self, row: Row, nbytes: int = 0) -> bool:
        """Queue a droppable row; False (dropped) past `queue_rows` or `queue_bytes`."""
        return self._queue.put(row, True, nbytes)

    def _put_always(self, row: Row, nbytes: int = 0) -> None:
        """Rare rows (resets, epochs, intervals, recoveries) are never dropped and never block,
        and go out without lingering (a reset is asked for as soon as it happened), but for a
        recovery's: it rides the take of the batches it follows, which linger anyway. In a
        fleet each reset makes several, and each hurry made a transaction of its own."""
        self._queue.put(row, False, nbytes)
        if type(row) is not RecoveryRow:
            self._queue.hurry()

    def _note_drop(
        self, stream: StreamId, state: StreamState, epoch: int, seq: int, ts: float
    ) -> None:
        """Batch times (engine clock) bound the hole: instants are asked for in that clock."""
        self.stats.batches_dropped += 1
        if state.dropped_from is None:
            state.dropped_from = (epoch, seq, ts)
            # One line per interval for all streams: an outage overflows every stream at once.
            self._drop_log.warning(
                "queue_full",
                "store queue full: dropping batches of %s from seq %d (counted)",
                stream,
                seq,
            )
        state.dropped_to = (seq, ts)
        state.pacer.force()

    def _close_drop(self, stream: StreamId, state: StreamState) -> None:
        assert state.dropped_from is not None and state.dropped_to is not None
        epoch, from_seq, from_ts = state.dropped_from
        to_seq, to_ts = state.dropped_to
        self._put_always(
            IntervalRow(
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

    def _checkpoint(self, batch: AppliedBatch, state: StreamState) -> None:
        blocks = batch.view.totals().blocks
        row = CheckpointRow(
            batch.stream, batch.epoch, batch.seq, batch.ts, blocks, copy_map(batch.view)
        )
        if self._put(row, len(row.snapshot)):
            state.pacer.queued(blocks)
