"""The recoveries one stream's writer follows, and when each is written: as it happens.

A recovery row goes out when a point is reached (the stream passed its offset on the engine's
clock), when t50 or t90 first become known, when the window is complete, when a later clear
ends it and when the writer closes: never a row per batch. Each row holds every point reached
so far and the summary as of then (peak orphans and the last batch followed ride along); rows
are upserts, so a fuller one overwrites a partial one. Rows depend on the batches only (their
engine stamps and contents), never on when they arrived: the same stream gives the same rows at
any speed.

Ingest thread only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kvscope.collector.sink import AppliedBatch, MapReader, TableReader
from kvscope.collector.types import StreamId, TableKey
from kvscope.storage._store_sink import RecoveriesCore
from kvscope.storage.recovery import RecoveryTracker
from kvscope.storage.rows import RecoveryRow

ResetKey = tuple[int, int, str]
"""(epoch, seq, reason): a reset's identity in the store."""


@dataclass(slots=True)
class _Followed:
    key: ResetKey
    tracker: RecoveryTracker
    t50_known: bool = False
    t90_known: bool = False


class StreamRecoveries(RecoveriesCore):
    """The recoveries being followed on one stream (at most one, in practice: a clear ends the
    one before it)."""

    def __init__(self, stream: StreamId, offsets: tuple[float, ...]) -> None:
        self.stream = stream
        self.offsets = offsets
        self.followed: list[_Followed] = []
        """The writer tests it for each batch (a C field of the base)."""

    def next_instants(self) -> Iterator[float]:
        """The engine-clock instants at which the next points are measured."""
        for followed in self.followed:
            at = followed.tracker.next_instant
            if at is not None:
                yield at

    def before_batch(self, view: MapReader, ts: float) -> list[RecoveryRow]:
        """The map before a batch stamped `ts`: a row for each recovery that reached a point."""
        return [self._row(f) for f in self.followed if f.tracker.before_batch(view, ts)]

    def after_batch(self, batch: AppliedBatch) -> list[RecoveryRow]:
        """After each batch: rows where t50 or t90 became known or the window completed."""
        rows, still = [], []
        for followed in self.followed:
            tracker = followed.tracker
            if batch.seq == followed.key[1] and batch.epoch == followed.key[0]:
                still.append(followed)  # the batch that carried the clear itself
                continue
            tracker.after_batch(batch.view, batch.ts)
            done = tracker.done
            t50, t90 = tracker.t50_s is not None, tracker.t90_s is not None
            if done or t50 is not followed.t50_known or t90 is not followed.t90_known:
                followed.t50_known, followed.t90_known = t50, t90
                rows.append(self._row(followed))
            if not done:
                still.append(followed)
        self.followed = still
        return rows

    def cleared(
        self, key: ResetKey, ts: float, tables: Mapping[TableKey, TableReader]
    ) -> list[RecoveryRow]:
        """A new clear: it ends the recoveries followed so far (their last rows) and starts its
        own."""
        rows = self.close()
        self.followed = [_Followed(key, RecoveryTracker.start(ts, tables, self.offsets))]
        return rows

    def resumed(self, key: ResetKey, tracker: RecoveryTracker) -> None:
        """Go on following a recovery rebuilt from the store (after a crash)."""
        self.followed.append(
            _Followed(key, tracker, tracker.t50_s is not None, tracker.t90_s is not None)
        )

    def close(self) -> list[RecoveryRow]:
        """The last rows of every recovery followed (what was reached stays stored)."""
        rows = [self._row(f) for f in self.followed]
        self.followed = []
        return rows

    def _row(self, followed: _Followed) -> RecoveryRow:
        return recovery_row(self.stream, followed.key, followed.tracker)


def recovery_row(stream: StreamId, key: ResetKey, tracker: RecoveryTracker) -> RecoveryRow:
    s = tracker.summary()
    return RecoveryRow(
        stream,
        key,
        tuple(tracker.points),
        s.t50_s,
        s.t90_s,
        s.peak_orphans,
        s.until_ts,
        tracker.done,
    )
