"""The zstd compression of the log's chunks (storage/log_chunks.py): each format's level, and
one call per compressor over a transaction's frames (the GIL goes once per call), its frames
left in zstd's own buffer, not copied out one by one: a chunk's bytes copy them in once, when
its frames are joined (`log_columns.assemble`)."""

from __future__ import annotations

import struct
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
    dictionary: Dictionary | None, level: int = DICTIONARY_ZSTD_LEVEL, coded: bool = True
) -> zstandard.ZstdCompressor:
    if dictionary is None:
        return plain_compressor(level, coded)
    return dictionary.compressor(level)


def compress_all(
    dictionary: Dictionary | None,
    items: list[bytes],
    level: int = DICTIONARY_ZSTD_LEVEL,
    coded: bool = True,
) -> list[bytes | memoryview]:
    """Each of `items` compressed, in one call: views of zstd's buffer (each keeps it alive).
    `coded` False: their literals left raw (`plain_compressor`)."""
    packer = compressor(dictionary, level, coded)
    if not any(items):  # which multi_compress_to_buffer refuses
        return [packer.compress(item) for item in items]
    # The largest first: each call makes a context, sized for the frame it starts with, and
    # makes it again, its tables cleared, for each frame that needs more (a frame's bytes do
    # not depend on the frames before it).
    order = sorted(range(len(items)), key=list(map(len, items)).__getitem__, reverse=True)
    sources: list[bytes | bytearray | memoryview] = [items[i] for i in order]
    done = segments(packer.multi_compress_to_buffer(sources))
    out: list[bytes | memoryview] = done[:]
    for frame, i in zip(done, order, strict=True):
        out[i] = frame
    return out


def segments(packed: zstandard.BufferWithSegmentsCollection) -> list[bytes | memoryview]:
    """The frames of `packed` as views, not copies (a segment exports its bytes, which its
    stubs do not say)."""
    return [memoryview(cast(Any, packed[i])) for i in range(len(packed))]


_plain = threading.local()


def plain_compressor(level: int, coded: bool = True) -> zstandard.ZstdCompressor:
    """A compressor without a dictionary at `level`, one per thread, kept (as `Dictionary`'s).
    `coded` False, at a level of zstd's fast strategy (1 or less): the literals its matches
    leave are stored as they are, not Huffman-coded (for bytes about random, which coding
    hardly shrinks, at the cost of a table per block): the fast strategy codes none once it
    is given a target length (zstd's `ZSTD_literalsCompressionIsDisabled`), which for it sets
    how far it steps past bytes with no match, as level 1's default does."""
    kept: dict[tuple[int, bool], zstandard.ZstdCompressor] | None = getattr(
        _plain, "by_level", None
    )
    if kept is None:
        kept = _plain.by_level = {}
    found = kept.get((level, coded))
    if found is None:
        if coded:
            found = zstandard.ZstdCompressor(level=level)
        elif level > 1:
            raise ValueError(f"zstd level {level} is not of the fast strategy")
        else:
            raw = zstandard.ZstdCompressionParameters(compression_level=level, target_length=1)
            found = zstandard.ZstdCompressor(compression_params=raw)
        kept[(level, coded)] = found
    return found


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_RAW_BLOCK = 1 << 17
"""The most a zstd block holds."""
RANDOM_SAMPLE = 64
"""The literals whose first bytes are looked at (fewer are left to zstd): a sample is enough, a
set of them all cost more than zstd's search it spares."""
_RANDOM_DISTINCT = 0.9 * 256.0 * (1.0 - (255.0 / 256.0) ** RANDOM_SAMPLE)
"""Distinct first bytes that random values' sample falls short of rarely (then zstd's search
finds out: the same frame, at its cost)."""


def raw_frame(data: bytes) -> bytes:
    """`data` as a zstd frame of raw blocks, its size in its header (what zstd writes for bytes
    it cannot make smaller, with no search first): any zstd decoder reads it back."""
    n = len(data)
    if n < 256:
        head = struct.pack("<4sBB", ZSTD_MAGIC, 0x20, n)  # one segment, a 1-byte size
    elif n < 256 + (1 << 16):
        head = struct.pack("<4sBH", ZSTD_MAGIC, 0x60, n - 256)
    elif n < 1 << 32:
        head = struct.pack("<4sBI", ZSTD_MAGIC, 0xA0, n)
    else:
        head = struct.pack("<4sBQ", ZSTD_MAGIC, 0xE0, n)
    view = memoryview(data)
    parts: list[bytes | memoryview] = [head]
    for start in range(0, max(n, 1), MAX_RAW_BLOCK):
        size = min(MAX_RAW_BLOCK, n - start)
        parts.append(((size << 3) | (start + size >= n)).to_bytes(3, "little"))  # raw, last?
        parts.append(view[start : start + size])
    return b"".join(parts)


def random_like(literals: bytes) -> bool:
    """Whether 8-byte values look drawn at random (hashes: zstd finds nothing to take out):
    the first bytes of a sample take about as many distinct values as random ones would.
    Values that share their upper bytes (small numbers, a counter) do not, and are left to
    zstd."""
    if len(literals) < 8 * RANDOM_SAMPLE:
        return False
    return len(set(literals[: 8 * RANDOM_SAMPLE : 8])) >= _RANDOM_DISTINCT
