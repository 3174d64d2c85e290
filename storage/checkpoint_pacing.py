"""When a stream's next checkpoint is due: paced by the log's bytes as stored.

A checkpoint is due once the log stored since the last one is `ratio` times that checkpoint's
size on disk (so checkpoints take at most 1/ratio of the log's bytes), or after
`every_batches` batches, or when forced (after a hole in the log). The ingest thread counts the
bytes each batch brings as received; the writer thread reports how the log packs and each
checkpoint's size on disk, which turn the stored bytes into received ones. Both threads touch
one pacer: each write is of one field, and the ingest thread reads one float per batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ESTIMATED_PACKING = 0.4
"""A checkpoint's size on disk over its raw size, until the writer reports the real one."""


@dataclass(slots=True)
class CheckpointPacer:
    ratio: float
    every_batches: int
    batches_since: int = 0
    bytes_since: int = 0
    """Log bytes received since the last checkpoint."""
    due_bytes: float = math.inf
    """Received bytes at which the next checkpoint is due; none is due by size until the
    writer first reports how the log packs."""
    forced: bool = False
    checkpoint: tuple[int, int] | None = None
    """(epoch, seq) of the last checkpoint queued."""
    on_disk: float = 0.0
    reported: tuple[tuple[int, int], int] | None = None
    """The last checkpoint the writer reported: its (epoch, seq) and size on disk."""
    log_raw: int = 0
    log_stored: int = 0

    def batch(self, nbytes: int) -> bool:
        """Count one batch of the log (ingest thread); whether a checkpoint is due."""
        since = self.bytes_since = self.bytes_since + nbytes
        batches = self.batches_since = self.batches_since + 1
        return since >= self.due_bytes or batches >= self.every_batches or self.forced

    def queued(self, at: tuple[int, int], raw_size: int) -> None:
        """A checkpoint at (epoch, seq) `at` was queued (ingest thread)."""
        self.batches_since = self.bytes_since = 0
        self.forced = False
        self.checkpoint = at
        # The writer thread may have written it, and reported its size, before this runs.
        reported = self.reported
        if reported is not None and reported[0] == at:
            self.on_disk = reported[1]
        else:
            self.on_disk = raw_size * ESTIMATED_PACKING
        self._pace()

    def written(self, at: tuple[int, int], size_on_disk: int) -> None:
        """The checkpoint at `at` was written, taking `size_on_disk` (writer thread)."""
        self.reported = (at, size_on_disk)
        if self.checkpoint == at:
            self.on_disk = size_on_disk
            self._pace()

    def packed(self, raw: int, stored: int) -> None:
        """Log bytes as received and as stored, of a chunk written (writer thread)."""
        self.log_raw += raw
        self.log_stored += stored
        self._pace()

    def _pace(self) -> None:
        if self.log_stored:
            packing = self.log_stored / self.log_raw
            self.due_bytes = self.ratio * self.on_disk / packing
