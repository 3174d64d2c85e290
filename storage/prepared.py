"""A transaction's rows made ready outside it (storage/sql_writer.py's `RowWriter.prepare`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.collector.types import StreamId
from kvscope.storage.log_chunks import ChunkRow
from kvscope.storage.log_dictionary import DictionaryRow
from kvscope.storage.rows import CheckpointRow, LogRow, RollupRow, Row


@dataclass
class Prepared:
    """Rows taken from the queue, made ready outside the transaction: the log packed into
    chunks, checkpoints encoded and compressed (zstd and the byte planes run without the GIL,
    and a retry redoes neither)."""

    ordered: list[Row] = field(default_factory=list)
    """The rare rows (epochs, resets, recoveries, intervals), in the order they came."""
    log: list[LogRow] = field(default_factory=list)
    """The batches the chunks hold (for the prefix followers: storage/prefix_followers.py)."""
    chunks: list[ChunkRow] = field(default_factory=list)
    dictionaries: list[DictionaryRow] = field(default_factory=list)
    """Those the chunks name that may not be stored yet."""
    rollups: list[RollupRow] = field(default_factory=list)
    checkpoints: list[CheckpointRow] = field(default_factory=list)
    """Encoded (`CheckpointRow.packed`): written with the log."""
    droppable: int = 0
    """Rows of the kinds the queue may drop (they count towards its bound)."""

    def streams(self) -> set[StreamId]:
        return {_stream(r) for rows in self._all() for r in rows}

    def keep_only(self, streams: set[StreamId]) -> dict[StreamId, int]:
        """Leave out the rows of every other stream; the rows left out (batches for the log's
        chunks), per stream."""
        left: dict[StreamId, int] = {}
        for rows in self._all():
            for r in rows:
                if (stream := _stream(r)) not in streams:
                    left[stream] = left.get(stream, 0) + (r.batches if type(r) is ChunkRow else 1)
        self.ordered = [r for r in self.ordered if _stream(r) in streams]
        self.log = [r for r in self.log if r[0] in streams]
        self.chunks = [r for r in self.chunks if r.stream in streams]
        self.dictionaries = [r for r in self.dictionaries if r.stream in streams]
        self.rollups = [r for r in self.rollups if r.stream in streams]
        self.checkpoints = [r for r in self.checkpoints if r.stream in streams]
        return left

    def _all(self) -> tuple[list[Row], list[ChunkRow], list[RollupRow], list[CheckpointRow]]:
        return self.ordered, self.chunks, self.rollups, self.checkpoints


def _stream(row: Row | ChunkRow | DictionaryRow) -> StreamId:
    stream = row[0] if type(row) is tuple else row.stream  # type: ignore[union-attr]
    assert isinstance(stream, StreamId)
    return stream
