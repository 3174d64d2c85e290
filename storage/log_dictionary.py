"""The batch log's dictionaries: each stream's recent token content, which its chunks (format 2,
storage/log_chunks.py) are compressed against.

Token ids are most of a batch's bytes, and a stream's blocks carry content seen long before
(prompts recur, evicted blocks are stored again), far more often than one chunk can see. The
writer keeps, per stream, the distinct runs of `GRANULE` token ids it has seen, most recent last
and at most `cap` bytes of them (`StreamContent`), and makes a zstd raw-content dictionary of
them now and then (`StreamContent.refresh`): once the log stored since the last one is `ratio`
times the new one's size on disk (dictionaries then take at most about 1/ratio of the log),
content seen since recurred as much as it would hold (else it would only cost), and enough of
it is new.

A dictionary is stored once, as its own row under its content's digest, which each chunk
compressed with it names (idempotent: a retried transaction writes the same row, and a chunk
decodes from its row and its dictionary's row alone). Memory per stream: the content kept (up
to `cap` bytes, and per run a 40-byte entry and its index's slots, in C), the current
dictionary's copy of it and zstd's tables for compressing against it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import zstandard

from kvscope.storage._granules import GranuleIndex
from kvscope.storage._token_granules import RunTable

Note = tuple[RunTable, list[bytes], int, int]
"""Content to note as `RunTable.note` does: (table, payloads, step, when)."""

GRANULE = 16
"""Token ids per run kept: vLLM's usual block size (a larger one is a multiple of it)."""
DEFAULT_CAP = 1 << 20
DEFAULT_RATIO = 8.0
FRESH_SHARE = 0.125
"""A new dictionary is made only once content worth this share of `cap` is new since the last."""
SAMPLE = 8
"""One batch in this many is noted once a stream's content holds steady."""
EVICT_TO = 0.875
"""Past the cap, content is dropped down to this share of it at once."""
STORED_SHARE = 0.5
"""About what a dictionary's content takes on disk, compressed."""
STORED_LEVEL = 1
"""A dictionary row's own compression (made once per dictionary): level 3's double-fast search
over its megabyte costs the writer several times level 1's, for a row hardly smaller
(benchmarks/writer_instructions.py); any level reads back alike."""


class Dictionary:
    """A raw-content zstd dictionary, named by its content's digest."""

    __slots__ = ("digest", "zstd", "_level", "_kept", "_granules", "_content")

    def __init__(self, content: bytes) -> None:
        self.digest = digest_of(content)
        # Holds the content (a copy): kept once per stream, not twice.
        self.zstd = zstandard.ZstdCompressionDict(content, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        self._level: int | None = None
        self._kept: tuple[int, int, zstandard.ZstdCompressor] | None = None
        """(thread, level, compressor): the last compressor made, for that thread only."""
        self._granules: GranuleIndex | None = None
        self._content: bytes | None = None
        """The content the granule index holds, once made: read from there, not copied."""

    @property
    def granules(self) -> GranuleIndex:
        """The content's granules by their bytes (log chunk format 4), made once: a race makes
        two equal ones, and one assignment keeps either."""
        made = self._granules
        if made is None:
            content = self.content
            made = self._granules = GranuleIndex(content)
            self._content = content
        return made

    @property
    def content(self) -> bytes:
        """zstd's copy of it, which each read copies again, until the granule index holds one."""
        held = self._content
        return self.zstd.as_bytes() if held is None else held

    def zstd_for(self, level: int) -> zstandard.ZstdCompressionDict:
        """The dictionary with zstd's tables for compressing at `level` made once (each
        compression would otherwise make them again)."""
        if self._level != level:
            self.zstd.precompute_compress(level=level)
            self._level = level
        return self.zstd

    def compressor(self, level: int) -> zstandard.ZstdCompressor:
        """A compressor against this dictionary at `level`, kept: making one costs about as
        much as compressing a transaction's chunks with it. Not shared between threads (zstd's
        contexts must not be): another thread gets one of its own."""
        thread, kept = threading.get_ident(), self._kept
        if kept is not None and kept[0] == thread and kept[1] == level:
            return kept[2]
        made = zstandard.ZstdCompressor(level=level, dict_data=self.zstd_for(level))
        self._kept = (thread, level, made)  # one assignment: a reader sees all of it or none
        return made


def digest_of(content: bytes) -> bytes:
    return hashlib.blake2b(content, digest_size=16).digest()


class DictionaryRow(NamedTuple):
    """A dictionary as it is stored (table `log_dictionaries`)."""

    stream: Any
    """Its stream (a `StreamId`), put as its id when written."""
    digest: bytes
    made_at: float
    raw_bytes: int
    data: bytes
    """The content, zstd-compressed."""


def row_of(stream: Any, dictionary: Dictionary, made_at: float) -> DictionaryRow:
    data = zstandard.ZstdCompressor(level=STORED_LEVEL).compress(dictionary.content)
    return DictionaryRow(stream, dictionary.digest, made_at, len(dictionary.content), data)


def from_stored(data: bytes) -> Dictionary:
    return Dictionary(zstandard.ZstdDecompressor().decompress(data))


class StreamContent:
    """One stream's token content seen, and its current dictionary (the writer thread's)."""

    __slots__ = (
        "cap",
        "ratio",
        "_seen",
        "_now",
        "_held",
        "_fresh",
        "_recurred",
        "current",
        "_since",
        "_steady",
        "_pending",
    )

    def __init__(self, cap: int = DEFAULT_CAP, ratio: float = DEFAULT_RATIO) -> None:
        self.cap = cap
        self.ratio = ratio
        self._seen = RunTable(GRANULE, cap)
        """Distinct runs, and when each was last seen (a count of `see` calls)."""
        self._now = 0
        self._held = 0
        self._fresh = 0
        """Bytes of runs not seen before since the current dictionary was made."""
        self._recurred = 0
        """Bytes of runs seen again (still held) since then: what a dictionary would have found."""
        self.current: Dictionary | None = None
        self._steady = False
        """The last transaction's content was mostly seen before, and the cap nearly full."""
        self._since = 0
        """Log bytes stored against the current dictionary (or none)."""
        self._pending = False
        """`to_note` gave a walk whose counts `noted` has not taken yet."""

    def see(self, payloads: Sequence[bytes]) -> None:
        """Note the runs of `payloads` (a transaction's) as seen now: all of them while the
        content is short of the cap or changing, one batch in `SAMPLE` once it holds steady
        (less to walk; a change still shows in the sample). The walk lets go of the GIL."""
        note = self.to_note(payloads)
        if note is not None:
            self.noted(*self._seen.note(*note[1:]))

    def to_note(self, payloads: Sequence[bytes]) -> Note | None:
        """`see`'s walk for another to run (the log's packing, in its own let-go of the GIL:
        storage/log_columns.py), `noted` given its counts after; None where nothing is noted."""
        if not self.cap:
            return None
        self._now += 1
        self._pending = True
        step = SAMPLE if self._steady else 1
        listed = payloads if type(payloads) is list else list(payloads)
        return self._seen, listed, step, self._now

    def noted(self, fresh: int, recurred: int) -> None:
        """What `to_note`'s walk found: bytes of runs new to the content, and of runs it held."""
        self._pending = False
        step = SAMPLE if self._steady else 1
        self._steady = self._held >= EVICT_TO * self.cap and fresh < FRESH_SHARE * recurred
        self._held += fresh
        self._fresh += fresh
        self._recurred += recurred * step  # what all the batches would have shown, about
        if self._held > self.cap:
            # The least recently seen go, down to EVICT_TO of the cap: a sort per eviction,
            # not a move per run seen.
            self._held = self._seen.evict(self._held, EVICT_TO * self.cap)

    @property
    def table(self) -> RunTable:
        return self._seen

    def pending(self) -> bool:
        """Whether a walk `to_note` gave waits for `noted`."""
        return self._pending

    def runs(self) -> list[bytes]:
        """The runs held, least recently seen first (of those seen together, first seen first)."""
        return self._seen.runs()

    def stored(self, log_bytes: int) -> None:
        self._since += log_bytes

    def refresh(self) -> Dictionary | None:
        """A new dictionary if one is due, else None: once the log stored since the last is
        `ratio` times the new one's size (stored, zstd takes token ids to about half), content
        that recurred since is as much as it holds (a stream whose content does not recur gets
        none: it would only cost), and enough of it is new."""
        size = self._held
        if not size or self._since < self.ratio * size * STORED_SHARE:
            return None
        if self._recurred < size or self._fresh < FRESH_SHARE * size:
            return None
        self.current = Dictionary(self._seen.content())  # the most recent last: nearest
        self._since = self._fresh = self._recurred = 0
        return self.current
