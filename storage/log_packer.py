"""The writer's log packing (storage/log_chunks.py's formats 2 and 3): each stream's chunks
against its current dictionary (storage/log_dictionary.py), and the dictionaries to store with
them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from kvscope.storage.log_chunks import CHUNK_FORMAT, ChunkRow, pack
from kvscope.storage.log_dictionary import (
    DEFAULT_CAP,
    DEFAULT_RATIO,
    Dictionary,
    DictionaryRow,
    StreamContent,
    row_of,
)
from kvscope.storage.rows import LogRow


class LogPacker:
    """The writer's log packing: each stream's chunks against its current dictionary, and the
    dictionaries to store with them."""

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

    def pack(self, log: Sequence[LogRow]) -> tuple[list[ChunkRow], list[DictionaryRow]]:
        """`log` in chunks of the format written, each stream's against its current dictionary,
        and the dictionaries they name that may not be stored yet; then what the log showed is kept,
        and a new dictionary made where one is due (for the next transaction's chunks)."""
        chunks = pack(log, self.fmt, self.current())
        by_stream: dict[Any, list[bytes]] = {}
        if len({chunk.stream for chunk in chunks}) == 1:  # nearly always: no loop in Python
            by_stream[chunks[0].stream] = list(map(itemgetter(5), log))
        else:
            for row in log:
                by_stream.setdefault(row[0], []).append(row[5])
        for chunk in chunks:
            self._content(chunk.stream).stored(len(chunk.data))
        now = time.time()
        for stream, payloads in by_stream.items():
            content = self._content(stream)
            content.see(payloads)
            made = content.refresh()
            if made is not None:
                self._unconfirmed[(stream, made.digest)] = row_of(stream, made, now)
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

    def committed(self, rows: Iterable[DictionaryRow]) -> None:
        for row in rows:
            self._unconfirmed.pop((row.stream, row.digest), None)

    def forget(self, stream: Any) -> None:
        """Another collector writes the stream now: it starts again from nothing here."""
        self._streams.pop(stream, None)
        for key in [key for key in self._unconfirmed if key[0] == stream]:
            del self._unconfirmed[key]

    def current(self) -> Mapping[Any, Dictionary]:
        return {s: c.current for s, c in self._streams.items() if c.current is not None}

    def _content(self, stream: Any) -> StreamContent:
        content = self._streams.get(stream)
        if content is None:
            content = self._streams[stream] = StreamContent(self.cap, self.ratio)
        return content
