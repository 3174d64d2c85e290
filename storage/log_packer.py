"""The writer's log packing (storage/log_chunks.py's formats 2 to 6): each stream's chunks
against its current dictionary (storage/log_dictionary.py), and the dictionaries to store with
them; in format 6 also against the hashes of its latest checkpoint (storage/log_known.py), once
that one is stored and while no later one is under way."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from kvscope.collector.snapshot import read_copy
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import CHUNK_FORMAT, ChunkRow
from kvscope.storage.log_dictionary import (
    DEFAULT_CAP,
    DEFAULT_RATIO,
    Dictionary,
    DictionaryRow,
    Note,
    StreamContent,
    row_of,
)
from kvscope.storage.log_known import Known, hashes_of
from kvscope.storage.rows import CheckpointRow, LogRow


class LogPacker:
    """The writer's log packing: each stream's chunks against its current dictionary, and the
    dictionaries to store with them."""

    note_in_walk = True
    """Formats 3 and up note the content in the columns' walk (False: after it, apart: a
    test's reference)."""

    def __init__(
        self, cap: int = DEFAULT_CAP, ratio: float = DEFAULT_RATIO, fmt: int = CHUNK_FORMAT
    ) -> None:
        self.cap = cap
        self.fmt = fmt
        self.ratio = ratio
        self._streams: dict[Any, StreamContent] = {}
        self._unconfirmed: dict[tuple[Any, bytes], DictionaryRow] = {}
        """Dictionaries made whose transaction has not committed yet: every transaction with a
        chunk that names one writes it too (a failed one may have taken it along)."""
        self._latest: dict[Any, tuple[int, int]] = {}
        """Per stream, the (epoch, seq) of the last checkpoint given to the writer."""
        self._pending: dict[Any, Known] = {}
        """Per stream, that checkpoint's hashes, until its transaction commits (format 6)."""
        self._known: dict[Any, Known] = {}
        """Per stream, the hashes of that checkpoint, stored: its chunks are packed against."""

    def pack(self, log: Sequence[LogRow]) -> tuple[list[ChunkRow], list[DictionaryRow]]:
        """`log` in chunks of the format written, each stream's against its current dictionary,
        and the dictionaries they name that may not be stored yet; then what the log showed is kept,
        and a new dictionary made where one is due (for the next transaction's chunks)."""
        if self.fmt >= 3 and self.note_in_walk:
            # The content noted in the columns' walk (one let-go of the GIL): the chunks are
            # packed against the dictionaries made before, as when it is noted after.
            notes: dict[Any, StreamContent] = {}
            before: dict[Any, tuple[int, int] | None] = {}

            def note(stream: Any, payloads: list[bytes]) -> Note | None:
                content = notes[stream] = self._content(stream)
                before[stream] = content.table.noted
                return content.to_note(payloads)

            try:
                chunks = pack(log, self.fmt, self.current(), self._known, note)
            except BaseException:
                self._walked(notes, before)
                raise
            self._made(chunks, notes)
        else:
            chunks = pack(log, self.fmt, self.current(), self._known)
            self._made(chunks, self._seen(chunks, log))
        named = {(c.stream, c.dictionary) for c in chunks if c.dictionary is not None}
        return chunks, [row for key, row in self._unconfirmed.items() if key in named]

    def unconfirmed(
        self, named: Iterable[tuple[Any, bytes]], written: Sequence[DictionaryRow]
    ) -> list[DictionaryRow]:
        """The dictionaries of `named` ((stream, digest): a checkpoint's, say) that may not be
        stored yet, less those `written` holds already: the transaction must write them."""
        held = {(row.stream, row.digest) for row in written}
        return [
            self._unconfirmed[key]
            for key in dict.fromkeys(named)
            if key in self._unconfirmed and key not in held
        ]

    def committed(self, rows: Iterable[DictionaryRow], checkpoints: Iterable[Any] = ()) -> None:
        """`rows` are stored, and the checkpoints of these streams that the transaction held."""
        for row in rows:
            self._unconfirmed.pop((row.stream, row.digest), None)
        for stream in checkpoints:
            pending = self._pending.pop(stream, None)
            if pending is not None and self._latest.get(stream) == (pending.epoch, pending.seq):
                self._known[stream] = pending

    def checkpoint(self, row: CheckpointRow) -> None:
        """A checkpoint goes into the transaction being prepared: no chunk is packed against
        an earlier one of its stream from now on, nor against this one until it is stored
        (a chunk after a checkpoint names that one or none: retention keeps it then)."""
        self._latest[row.stream] = (row.epoch, row.seq)
        self._known.pop(row.stream, None)
        self._pending.pop(row.stream, None)
        if self.fmt >= 6:
            tables = read_copy(row.snapshot)["tables"]  # (the hashes as views: not copied)
            hashes = hashes_of(table["hashes"] for table in tables)
            self._pending[row.stream] = Known(row.epoch, row.seq, hashes)

    def forget_checkpoints(self, stream: Any | None = None) -> None:
        """A transaction failed (None: every stream's) or the stream moved: no chunk is
        packed against a checkpoint until one is known stored again."""
        for held in (self._latest, self._pending, self._known):
            if stream is None:
                held.clear()
            else:
                held.pop(stream, None)

    def forget(self, stream: Any) -> None:
        """Another collector writes the stream now: it starts again from nothing here."""
        self.forget_checkpoints(stream)
        self._streams.pop(stream, None)
        for key in [key for key in self._unconfirmed if key[0] == stream]:
            del self._unconfirmed[key]

    def current(self) -> Mapping[Any, Dictionary]:
        return {s: c.current for s, c in self._streams.items() if c.current is not None}

    def _seen(self, chunks: Sequence[ChunkRow], log: Sequence[LogRow]) -> dict[Any, StreamContent]:
        """Each stream's content, `log`'s payloads noted in it (the streams in the order they
        first come)."""
        by_stream: dict[Any, list[bytes]] = {}
        if len({chunk.stream for chunk in chunks}) == 1:  # nearly always: no loop in Python
            by_stream[chunks[0].stream] = list(map(itemgetter(5), log))
        else:
            for row in log:
                by_stream.setdefault(row[0], []).append(row[5])
        seen = {}
        for stream, payloads in by_stream.items():
            content = seen[stream] = self._content(stream)
            content.see(payloads)
        return seen

    def _made(self, chunks: Sequence[ChunkRow], seen: Mapping[Any, StreamContent]) -> None:
        """The chunks' bytes counted against their streams' dictionaries, then the
        dictionaries due made (`seen`: the streams whose content was noted, in order)."""
        for chunk in chunks:
            self._content(chunk.stream).stored(len(chunk.data))
        now = time.time()
        for stream, content in seen.items():
            noted = content.table.noted
            if content.pending() and noted is not None:
                content.noted(*noted)
            made = content.refresh()
            if made is not None:
                self._unconfirmed[(stream, made.digest)] = row_of(stream, made, now)

    @staticmethod
    def _walked(
        notes: Mapping[Any, StreamContent], before: Mapping[Any, tuple[int, int] | None]
    ) -> None:
        """After a packing that raised: the walks that ran all the same (the others' when one
        ran out of memory) counted, so that each content counts the runs its table holds. A
        walk not run leaves its table's `noted` as it was, or closed as nothing seen."""
        for stream, content in notes.items():
            noted = content.table.noted
            if noted is None or noted is before[stream] or noted == (0, 0):
                continue
            if content.pending():
                content.noted(*noted)

    def _content(self, stream: Any) -> StreamContent:
        content = self._streams.get(stream)
        if content is None:
            content = self._streams[stream] = StreamContent(self.cap, self.ratio)
        return content
