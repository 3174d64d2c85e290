"""A stream's chunks stored before its first log dictionary formed, packed again against it.

A stream's writer has no dictionary until its content has recurred enough
(storage/log_dictionary.py): on a busy stream that is tens of seconds of log, whose chunks pack
about twice as large as those after. Once a committed transaction's chunks name the stream's
current dictionary, the stream's chunks that name none are re-written against it
(storage/log_rewrite.py: the same batches, exactly, in the writer's format; a step's chunks in
one UPDATE on PostgreSQL, storage/bulk_sql.py's `update_repacked`, so a reader sees a chunk's old
bytes or its new ones, and a failed transaction leaves the old),
until none is left. That is compaction, done once per chunk: the writer does it only where it
would wait for rows anyway (none queued, or lingering for more: storage/write_loop.py), a `step`
per transaction of its own, so that a backlog never waits on it. The dictionary is safe to name:
a committed transaction stored it and its chunks name it, so retention keeps it. Every
dictionary-less chunk of the stream is taken, whichever epoch or writer stored it (a restarted
writer has none until its content recurs again).

A step re-writes `CHUNKS_PER_STEP` chunks at most, whatever the number of streams (after an
upgrade, a fleet's streams all have such chunks): the streams take turns, the one served
longest ago first, so each is served in the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.bulk_sql import REPACKED_COLUMNS, update_repacked
from kvscope.storage.log_chunks import ChunkRow
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_rewrite import repacked

logger = logging.getLogger(__name__)

CHUNKS_PER_STEP = 2
"""Chunks re-written per step (of all its streams together), at most: a short transaction (a
chunk holds up to `MAX_CHUNK_BATCHES` batches) that rows arriving meanwhile wait out, the rest
left to the next steps."""


class PreDictionaryRepack:
    """The writer thread's: which streams may still have chunks that name no dictionary."""

    def __init__(self, fmt: int, per_step: int = CHUNKS_PER_STEP) -> None:
        self.fmt = fmt
        self.per_step = per_step
        self._ready: dict[StreamId, Dictionary] = {}
        """Per stream that may have chunks left, a dictionary committed chunks name."""
        self._finished: dict[StreamId, Dictionary] = {}
        """Streams the step under way found with none left: back to `_ready` if it fails."""
        self._done: set[StreamId] = set()
        """Streams with none left, as of a step committed (or one under way)."""
        self.unreadable = 0
        """Chunks passed by because they could not be read or packed again (damaged bytes)."""
        self._log = RateLimitedLog(logger)
        self._after: dict[StreamId, tuple[int, int]] = {}
        """Per stream, the last chunk looked at: one that could not be re-written (its batches
        no longer fit one chunk) is passed by, not taken again and again."""
        self._turns = 0
        self._served: dict[StreamId, int] = {}
        """Per stream with chunks left, the turn it was last served: the least recent goes
        first."""

    @property
    def pending(self) -> bool:
        """Whether a step may have chunks to re-write (or one is under way): read from any
        thread."""
        return bool(self._ready or self._finished)

    def committed(self, chunks: Sequence[ChunkRow], current: Mapping[StreamId, Dictionary]) -> None:
        """`chunks` are stored: the streams among them whose chunks name their `current`
        dictionary may have chunks to re-write against it."""
        for stream, digest in {(c.stream, c.dictionary) for c in chunks if c.dictionary}:
            found = current.get(stream)
            if stream not in self._done and found is not None and found.digest == digest:
                self._ready[stream] = found

    def step(
        self,
        conn: sa.Connection,
        stream_id: Callable[[StreamId], int],
        admit: Callable[[set[StreamId]], set[StreamId]] | None = None,
    ) -> int:
        """Within a transaction of its own: re-write up to `per_step` chunks that name no
        dictionary, of the streams that have some (those `admit` keeps: with leases, the ones
        still held), against the dictionary their chunks name; how many were taken. Then
        `stepped`, or `forget` if the transaction failed."""
        self._finished = {}
        waiting = sorted(self._ready.items(), key=lambda w: (self._served.get(w[0], -1), str(w[0])))
        budget = self.per_step
        rows: list[tuple[Any, ...]] = []
        share = max(1, -(-budget // max(1, len(waiting))))  # a lone stream takes it all
        for stream, found in waiting:
            if budget <= 0:
                break
            limit = min(share, budget)
            taken = self._repack_stream(conn, stream, found, stream_id(stream), limit, admit, rows)
            budget -= taken
            if taken:
                self._turns += 1
                self._served[stream] = self._turns
        # The step's chunks, of every stream, in one statement (PostgreSQL): after each
        # stream's lease was admitted, in this transaction.
        update_repacked(conn, rows)
        return self.per_step - budget

    def stepped(self) -> None:
        """The step's transaction committed."""
        self._finished = {}

    def _repack_stream(
        self,
        conn: sa.Connection,
        stream: StreamId,
        found: Dictionary,
        sid: int,
        limit: int,
        admit: Callable[[set[StreamId]], set[StreamId]] | None,
        rows: list[tuple[Any, ...]],
    ) -> int:
        """Up to `limit` of `stream`'s chunks that name no dictionary packed again against
        `found`, if `admit` keeps it, put in `rows` (the step writes them); how many were taken
        (re-packed or passed by)."""
        c = schema.log_chunks
        # Their bytes with their keys: a round trip fewer per chunk.
        query = sa.select(c.c.epoch, c.c.first_seq, c.c.data).where(
            c.c.stream_id == sid, c.c.dictionary.is_(None)
        )
        after = self._after.get(stream)
        if after is not None:
            query = query.where(sa.tuple_(c.c.epoch, c.c.first_seq) > after)
        keys = conn.execute(query.order_by(c.c.epoch, c.c.first_seq).limit(limit + 1)).all()
        # Admitted only where chunks are re-written (the lease counts this transaction as a
        # write of the stream). The chunks read before it are this writer's to re-write: had
        # another writer held the stream meanwhile, its token would differ.
        if keys and admit is not None and not admit({stream}):
            self.forget(stream)  # another collector's now
            return 0
        for epoch, first_seq, data in keys[:limit]:
            self._after[stream] = (epoch, first_seq)
            try:
                values = repacked(conn, (sid, epoch, first_seq), self.fmt, found, bytes(data))
            except sa.exc.SQLAlchemyError:
                raise  # the transaction's own failure: retried as a whole
            except Exception as exc:  # a damaged chunk must not cost the rows beside it
                self.unreadable += 1
                self._log.warning(
                    "unreadable", "log chunk %s of %s left as it is: %s", first_seq, stream, exc
                )
                continue
            if values is not None:  # else its batches no longer fit one chunk: passed by
                rows.append((sid, epoch, first_seq, *(values[n] for n in REPACKED_COLUMNS)))
        if len(keys) <= limit:
            self._done.add(stream)
            self._served.pop(stream, None)
            # Listed before it leaves `_ready`: `pending` never reads both without it.
            self._finished[stream] = self._ready[stream]
            del self._ready[stream]
        return min(len(keys), limit)

    def forget(self, stream: StreamId | None = None) -> None:
        """A failed step (None: its re-writes rolled back), or a stream another writer may
        write from now on: its chunks are its writer's to re-write."""
        if stream is None:
            self._ready.update(self._finished)
            self._finished = {}
            self._done.clear()
            self._after.clear()
        else:
            self._ready.pop(stream, None)
            self._finished.pop(stream, None)
            self._done.discard(stream)
            self._after.pop(stream, None)
            self._served.pop(stream, None)
