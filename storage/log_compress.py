"""The zstd compression of the log's chunks (storage/log_chunks.py): each format's level, and
one call per compressor over a transaction's frames (the GIL goes once per call), its frames
left in zstd's own buffer, not copied out one by one: a chunk's bytes copy them in once, when
its frames are joined (`log_columns.assemble`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

import zstandard

from kvscope.storage.log_dictionary import Dictionary

ZSTD_LEVEL = 1
"""Format 1's level: higher ones pack it hardly smaller at a much lower speed."""
DICTIONARY_ZSTD_LEVEL = 3
"""Format 2's: level 1 finds few of the matches a dictionary offers (benchmarks/store.py)."""
TOKENS_ZSTD_LEVEL = 4
"""Format 3's token ids: level 4 finds more of the dictionary's matches than 3, and 5 to 8 far
fewer (benchmarks/_store_disk.py's stream)."""
COLUMNS_ZSTD_LEVEL = 1
"""Formats 3 to 6's frames, and from format 4 on their token ids too: zstd's fast strategy.
Each call makes a fresh context (one per transaction and compressor), whose tables the higher
levels' double-fast strategy makes many times larger (cleared each time) and searches more
slowly, for frames hardly smaller: the columns leave zstd little to find beyond long repeats,
and the granules a dictionary holds are stored as their numbers (benchmarks/_store_disk.py,
benchmarks/store_instructions.py)."""


def by_dictionary(
    streams: Sequence[Any], dictionaries: Mapping[Any, Dictionary]
) -> dict[Dictionary | None, list[int]]:
    """The positions of `streams`, by the dictionary each stream's chunks are compressed with."""
    found: dict[Dictionary | None, list[int]] = {}
    for i, stream in enumerate(streams):
        found.setdefault(dictionaries.get(stream), []).append(i)
    return found


def compressor(
    dictionary: Dictionary | None, level: int = DICTIONARY_ZSTD_LEVEL
) -> zstandard.ZstdCompressor:
    return plain_compressor(level) if dictionary is None else dictionary.compressor(level)


def compress_all(
    dictionary: Dictionary | None, items: list[bytes], level: int = DICTIONARY_ZSTD_LEVEL
) -> list[bytes | memoryview]:
    """Each of `items` compressed, in one call: views of zstd's buffer (each keeps it alive)."""
    packer = compressor(dictionary, level)
    if not any(items):  # which multi_compress_to_buffer refuses
        return [packer.compress(item) for item in items]
    sources: list[bytes | bytearray | memoryview] = list(items)
    return segments(packer.multi_compress_to_buffer(sources))


def segments(packed: zstandard.BufferWithSegmentsCollection) -> list[bytes | memoryview]:
    """The frames of `packed` as views, not copies (a segment exports its bytes, which its
    stubs do not say)."""
    return [memoryview(cast(Any, packed[i])) for i in range(len(packed))]


_plain = threading.local()


def plain_compressor(level: int) -> zstandard.ZstdCompressor:
    """A compressor without a dictionary at `level`, one per thread, kept (as `Dictionary`'s)."""
    kept: dict[int, zstandard.ZstdCompressor] | None = getattr(_plain, "by_level", None)
    if kept is None:
        kept = _plain.by_level = {}
    found = kept.get(level)
    if found is None:
        found = kept[level] = zstandard.ZstdCompressor(level=level)
    return found
