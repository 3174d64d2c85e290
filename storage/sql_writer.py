"""The writer thread's side: rows into SQL, a transaction at a time (SQLite or PostgreSQL)."""

from __future__ import annotations

import logging
from functools import partial

from sqlalchemy import Connection, insert, select, update

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.snapshot import blocks_named
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage._row_streams import plain_tuples
from kvscope.storage.bulk_sql import (
    insert_log,
    insert_log_fenced,
    update_recovery,
    upsert_recovery_points,
    upsert_released,
)
from kvscope.storage.checkpoint_deltas import CheckpointEncoder
from kvscope.storage.history import NotInStore
from kvscope.storage.leases import Fence
from kvscope.storage.log_chunks import ChunkError
from kvscope.storage.log_dictionaries_sql import insert_dictionaries
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.log_repack import PreDictionaryRepack
from kvscope.storage.prefix_followers import PrefixFollowers
from kvscope.storage.prepared import Prepared
from kvscope.storage.recovery_known import WrittenRecoveries
from kvscope.storage.recovery_merge import one_recovery_each
from kvscope.storage.rows import (
    CheckpointRow,
    EpochRow,
    IntervalRow,
    LogRow,
    RecoveryRow,
    ResetRow,
    RollupRow,
    Row,
    encode_before,
)
from kvscope.storage.upsert import upsert_statement


class RowWriter:
    """Writes rows within a caller's transaction; caches stream and reset ids between them."""

    def __init__(
        self,
        shard: str | None,
        followers: PrefixFollowers | None = None,
        fence: Fence | None = None,
        packer: LogPacker | None = None,
        checkpoints: CheckpointEncoder | None = None,
    ) -> None:
        self.shard = shard
        self.fence = fence
        """With leases: each transaction writes only the streams whose lease it still holds."""
        self._stream_ids: dict[StreamId, int] = {}
        self._reset_ids: dict[tuple[StreamId, tuple[int, int, str]], int] = {}
        self.followers = followers or PrefixFollowers()
        self.groups_unreadable = 0
        """Answers of recovering resets left without prefix groups: their log cannot be read."""
        self._unreadable_log = RateLimitedLog(logging.getLogger(__name__))
        self.packer = packer or LogPacker()
        self.checkpoints = checkpoints or CheckpointEncoder(0.0)
        self.repack = PreDictionaryRepack(self.packer.fmt)
        self._recovered = WrittenRecoveries()
        self.streams_written = 0
        """The streams whose log the last transaction prepared held: how many the next may
        take rows for (`writer_state.rows_per_take`)."""

    def forget_ids(self) -> None:
        """A failed transaction may have rolled back ids we cached within it, and batches the
        prefix followers were fed."""
        self._stream_ids.clear()
        self._reset_ids.clear()
        self.followers.forget()
        # A key in it may be refused for good: deltas are made on keys known to be written.
        self.checkpoints.forget()
        self.packer.forget_checkpoints()

    def forget_stream(self, stream: StreamId) -> None:
        """`stream` is written no more (its lease moved away): its reset's follower, its
        cached ids and its log's content go, rather than wait for the cap."""
        self.followers.drop(stream)
        self.packer.forget(stream)
        self.checkpoints.forget(stream)
        self.repack.forget(stream)
        self._stream_ids.pop(stream, None)
        for key in [k for k in self._reset_ids if k[0] == stream]:
            del self._reset_ids[key]

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
                    .values(replica=stream.replica, rank=stream.rank, shard=self.shard)
                    .returning(t.c.id)
                ).scalar_one()
            sid = self._stream_ids[stream] = int(found)
        return sid

    def prepare(self, rows: list[Row]) -> Prepared:
        prepared = Prepared()
        # Nearly every row is a batch for the log: those are picked out in one pass.
        log: list[LogRow] = plain_tuples(rows)
        named: list[tuple[StreamId, bytes]] = []
        if len(log) < len(rows):
            for row in rows:
                if type(row) is tuple:
                    continue
                if type(row) is RollupRow:
                    prepared.rollups.append(row)
                    continue
                if type(row) is CheckpointRow:
                    if not row.packed:  # rows retried one by one come back here
                        current = self.packer.current().get(row.stream)
                        self.checkpoints.encode(row, current)
                    self.packer.checkpoint(row)
                    digest = blocks_named(row.packed)
                    if digest is not None:  # stored with it, unless stored already
                        named.append((row.stream, digest))
                    prepared.checkpoints.append(row)
                    continue
                if type(row) is ResetRow and not row.packed_before:
                    # Outside the transaction: a 1M-block map takes a good part of a second.
                    row.packed_before = encode_before(row.before)
                prepared.ordered.append(row)
        prepared.log = log
        prepared.chunks, prepared.dictionaries = self.packer.pack(log)
        self.streams_written = len({chunk.stream for chunk in prepared.chunks})
        if named:
            prepared.dictionaries += self.packer.unconfirmed(named, prepared.dictionaries)
        prepared.droppable = len(log) + len(prepared.rollups) + len(prepared.checkpoints)
        return prepared

    def committed(self, prepared: Prepared) -> None:
        """`prepared` landed: its dictionaries and checkpoints are stored, and the prefix
        groups written."""
        self.packer.committed(
            prepared.dictionaries,
            [row.stream for row in prepared.checkpoints],
        )
        self.followers.committed()
        if prepared.chunks:
            self.repack.committed(prepared.chunks, self.packer.current())

    def one_statement(self, prepared: Prepared, dialect: str) -> bool:
        """Whether `write` sends `prepared` as one statement, which then needs no transaction
        around it (no BEGIN and COMMIT round trips: storage/autocommit.py). On PostgreSQL, the
        log's statement alone (`insert_log`: chunks, checkpoints, rollups; under leases, with
        their check), its streams' ids known: not a write with rare rows, with dictionaries
        (a statement each), or with a stream's first rows (its id looked up)."""
        if dialect != "postgresql" or prepared.ordered or prepared.dictionaries:
            return False
        ids = self._stream_ids
        return all(s in ids for s in prepared.streams())

    def write(self, conn: Connection, prepared: Prepared) -> None:
        if self.one_statement(prepared, conn.dialect.name):
            self._write_log_alone(conn, prepared)
            return
        leases: dict[StreamId, int] | None = None
        if self.fence is not None:
            # Checked in this transaction, the lease rows held until it commits: a stream
            # taken over meanwhile gets none of these rows.
            before = self.fence.held()
            leases = self._admitted(prepared, self.fence.admit(conn, prepared.streams()), before)
        # Epochs, resets and recoveries keep their order (a recovery needs its reset's id).
        self._recovered.begin(leases)
        for row in one_recovery_each(prepared.ordered):
            self._write_one(conn, row)
        stream_id = partial(self._stream_id, conn)
        if prepared.dictionaries:  # before the chunks that name them
            insert_dictionaries(conn, prepared.dictionaries, stream_id)
        insert_log(
            conn,
            prepared.chunks,
            prepared.rollups,
            stream_id,
            self._stream_ids,
            prepared.checkpoints,
        )
        # After the log: the groups follow it (the batches up to an offset came before the
        # recovery row that says it was reached), fed what this transaction wrote.
        self.followers.logged(prepared.ordered, prepared.log)
        followed = {(r.stream, r.key) for r in prepared.ordered if type(r) is RecoveryRow}
        for stream, key in sorted(followed, key=str):
            reset_id = self._reset_id(conn, stream, key)
            try:
                self.followers.store(conn, stream, reset_id, self._recovered.written(stream, key))
            except NotInStore as exc:  # no groups, none made up
                if isinstance(exc, ChunkError):  # its log cannot be read: said, not hidden
                    self.groups_unreadable += 1
                    self._unreadable_log.warning(
                        "groups", "reset %s of %s: no prefix groups: %s", reset_id, stream, exc
                    )
                # else its clear's batch was dropped (an outage)

    def _write_log_alone(self, conn: Connection, prepared: Prepared) -> None:
        """`one_statement`'s write: the log's statement, under leases with their check."""
        ids = self._stream_ids
        if self.fence is None:
            insert_log(
                conn, prepared.chunks, prepared.rollups, ids.__getitem__, ids, prepared.checkpoints
            )
        else:
            before = self.fence.held()
            check = self.fence.check(prepared.streams())
            admitted = set()
            if check is not None:
                admitted = insert_log_fenced(
                    conn, check, prepared.chunks, prepared.rollups, prepared.checkpoints, ids
                )
            self._admitted(prepared, admitted, before)
        self.followers.logged(prepared.ordered, prepared.log)

    def _admitted(
        self, prepared: Prepared, admitted: set[StreamId], before: dict[StreamId, int]
    ) -> dict[StreamId, int]:
        """The fence admitted `admitted` of `prepared`'s streams (this member held `before`):
        the rows of the others left out and their state forgotten; the lease each admitted
        stream was admitted under (unsure where it changed meanwhile: left out)."""
        assert self.fence is not None
        after = self.fence.held()
        for stream, rows in prepared.keep_only(admitted).items():
            self.fence.refused(stream, rows)
            self.packer.forget(stream)
            self.checkpoints.forget(stream)
            self.repack.forget(stream)
        return {s: t for s, t in before.items() if after.get(s) == t}

    @property
    def idle_work(self) -> bool:
        """Whether work is left for when no row waits (storage/log_repack.py's re-packing):
        read from any thread."""
        return self.repack.pending

    def idle_step(self, conn: Connection) -> int:
        """Within a transaction of its own, when no row waits: some of the chunks stored
        before their stream's dictionary formed, re-written against it; how many. Then
        `idle_ended`."""
        # With leases, as any transaction of the writer's: only the streams still held.
        admit = None if self.fence is None else partial(self.fence.admit, conn)
        return self.repack.step(conn, partial(self._stream_id, conn), admit)

    def idle_ended(self, committed: bool) -> None:
        """The `idle_step`'s transaction committed, or failed (rolled back: done again)."""
        if committed:
            self.repack.stepped()
        else:
            self.repack.forget()

    def _write_one(self, conn: Connection, row: Row) -> None:
        if type(row) is EpochRow:
            t = schema.epochs
            sid = self._stream_id(conn, row.stream)
            exists = conn.execute(
                select(t.c.epoch).where(t.c.stream_id == sid, t.c.epoch == row.epoch)
            ).first()
            if exists is None:
                conn.execute(
                    insert(t).values(stream_id=sid, epoch=row.epoch, started_recv_ts=row.recv_ts)
                )
        elif type(row) is ResetRow:
            epoch, seq, reason = row.key
            key = ("stream_id", "epoch", "seq", "reason")
            values = {
                "stream_id": self._stream_id(conn, row.stream),
                "epoch": epoch,
                "seq": seq,
                "ts": row.ts,
                "recv_ts": row.recv_ts,
                "reason": reason,
                "degraded": row.degraded,
                "before_blocks": row.before_blocks,
                "before_hittable": row.before_hittable,
                "before_orphans": row.before_orphans,
                "before_tokens": row.before_tokens,
                "before": row.packed_before,
            }
            # A retried reset sets its own columns only: its id (which its points refer to)
            # and the recovery written since stay.
            if conn.dialect.name == "sqlite":
                reset_id = upsert_released(conn, schema.resets, key, values, returning="id")
            else:
                upsert = upsert_statement(conn, schema.resets, key, values)
                reset_id = conn.execute(upsert.returning(schema.resets.c.id), values).scalar_one()
            self._reset_ids[(row.stream, row.key)] = int(reset_id)
            self.followers.reset_written(int(reset_id))
        elif type(row) is RecoveryRow:
            reset_id = self._reset_id(conn, row.stream, row.key)
            figures = (row.t50_s, row.t90_s, row.peak_orphans, row.until_ts, row.complete)
            updated = update_recovery(conn, reset_id, figures, row.points)
            if updated is not None:
                if updated:
                    self._recovered.updated(row)
                return
            t = schema.resets
            updated = conn.execute(
                update(t)
                .where(t.c.id == reset_id)
                .values(
                    t50_s=row.t50_s,
                    t90_s=row.t90_s,
                    peak_orphans=row.peak_orphans,
                    recovery_until_ts=row.until_ts,
                    recovery_complete=row.complete,
                )
            ).rowcount
            if row.points:
                upsert_recovery_points(conn, reset_id, row.points)
            if updated:
                self._recovered.updated(row)
        elif type(row) is IntervalRow:
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
