"""A stream's chunks stored before its first log dictionary formed, packed again against it.

A stream's writer has no dictionary until its content has recurred enough
(storage/log_dictionary.py): on a busy stream that is tens of seconds of log, whose chunks pack
about twice as large as those after. Once a transaction's chunks name the stream's current
dictionary, that transaction also re-writes some of the stream's chunks that name none
(storage/log_rewrite.py: the same batches, exactly, in the writer's
format; one UPDATE each, so a reader sees a chunk's old bytes or its new ones, and a failed
transaction leaves the old), until none is left. The dictionary is safe to name: the
transaction stores it if it is not stored yet, and its own chunks name it, so retention keeps
it. Every dictionary-less chunk of the stream is taken, whichever epoch or writer stored it (a
restarted writer has none until its content recurs again).

A transaction re-writes `CHUNKS_PER_TRANSACTION` chunks at most, whatever the number of streams
(after an upgrade, a fleet's streams all have such chunks): the streams take turns, the one
served longest ago first, so each is served in the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.log_chunks import ChunkRow
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_rewrite import rewrite_chunk

logger = logging.getLogger(__name__)

CHUNKS_PER_TRANSACTION = 2
"""Chunks re-written per transaction (of all its streams together), at most: bounded work in
the writer's transaction (a chunk holds up to `MAX_CHUNK_BATCHES` batches), the rest left to the
next ones."""


class PreDictionaryRepack:
    """The writer thread's: which streams may still have chunks that name no dictionary."""

    def __init__(self, fmt: int, per_transaction: int = CHUNKS_PER_TRANSACTION) -> None:
        self.fmt = fmt
        self.per_transaction = per_transaction
        self._done: set[StreamId] = set()
        """Streams with none left, as of a transaction committed (or one under way)."""
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

    def repack(
        self,
        conn: sa.Connection,
        chunks: Sequence[ChunkRow],
        current: Callable[[StreamId], Dictionary | None],
        stream_id: Callable[[StreamId], int],
    ) -> int:
        """Within the transaction writing `chunks`: re-write, for the streams whose chunks
        there name their `current` dictionary, some of their chunks that name none; how many
        were taken."""
        named = {(c.stream, c.dictionary) for c in chunks if c.dictionary is not None}
        waiting: list[tuple[StreamId, Dictionary]] = []
        for stream in {stream for stream, _ in named} - self._done:
            found = current(stream)
            if found is not None and (stream, found.digest) in named:
                waiting.append((stream, found))
        waiting.sort(key=lambda w: (self._served.get(w[0], -1), str(w[0])))
        budget = self.per_transaction
        share = max(1, -(-budget // max(1, len(waiting))))  # a lone stream takes it all
        for stream, found in waiting:
            if budget <= 0:
                break
            taken = self._repack_stream(conn, stream, found, stream_id(stream), min(share, budget))
            budget -= taken
            if taken:
                self._turns += 1
                self._served[stream] = self._turns
        return self.per_transaction - budget

    def _repack_stream(
        self, conn: sa.Connection, stream: StreamId, found: Dictionary, sid: int, limit: int
    ) -> int:
        """Up to `limit` of `stream`'s chunks that name no dictionary re-written against
        `found`; how many were taken (re-written or passed by)."""
        c = schema.log_chunks
        query = sa.select(c.c.epoch, c.c.first_seq).where(
            c.c.stream_id == sid, c.c.dictionary.is_(None)
        )
        after = self._after.get(stream)
        if after is not None:
            query = query.where(sa.tuple_(c.c.epoch, c.c.first_seq) > after)
        keys = conn.execute(query.order_by(c.c.epoch, c.c.first_seq).limit(limit + 1)).all()
        for epoch, first_seq in keys[:limit]:
            self._after[stream] = (epoch, first_seq)
            try:
                rewrite_chunk(conn, c, (sid, epoch, first_seq), self.fmt, found)
            except sa.exc.SQLAlchemyError:
                raise  # the transaction's own failure: retried as a whole
            except Exception as exc:  # a damaged chunk must not cost the rows beside it
                self.unreadable += 1
                self._log.warning(
                    "unreadable", "log chunk %s of %s left as it is: %s", first_seq, stream, exc
                )
        if len(keys) <= limit:
            self._done.add(stream)
            self._served.pop(stream, None)
        return min(len(keys), limit)

    def forget(self, stream: StreamId | None = None) -> None:
        """A failed transaction (None: every stream's re-writes rolled back with it), or a
        stream another writer may have written meanwhile: look again."""
        if stream is None:
            self._done.clear()
            self._after.clear()
        else:
            self._done.discard(stream)
            self._after.pop(stream, None)
            self._served.pop(stream, None)
