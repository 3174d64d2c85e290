"""Format 2's compressors are made once per dictionary and thread, not once per transaction,
and the chunks they make are byte for byte those of fresh ones."""

from __future__ import annotations

import random
import threading
from array import array
from typing import Any

import pytest
import zstandard

from kvscope.storage import log_compress
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_known import Known, hashes_of
from tests.test_log_dictionary import A, B, block_log, runs_of, token_pool


def test_each_dictionarys_compressor_is_made_once_and_packs_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(7)
    pool = token_pool(rng)
    rows = block_log(rng, 200, pool) + block_log(rng, 30, pool, B)
    content = b"".join(run for block in pool for run in runs_of(block))
    fresh = pack(rows, 2, {A: Dictionary(content)})  # made with compressors of their own
    made: list[Any] = []
    real = zstandard.ZstdCompressor

    def counted(*args: Any, **kwargs: Any) -> zstandard.ZstdCompressor:
        made.append(kwargs.get("dict_data"))
        return real(*args, **kwargs)

    monkeypatch.setattr(zstandard, "ZstdCompressor", counted)
    monkeypatch.setattr(log_compress, "_plain", threading.local())
    dictionary = Dictionary(content)
    for _ in range(3):  # three transactions: A's dictionary and B's none, each made once
        assert pack(rows, 2, {A: dictionary}) == fresh
    assert len(made) == 2 and made.count(None) == 1

    other: list[zstandard.ZstdCompressor] = []
    thread = threading.Thread(target=lambda: other.append(dictionary.compressor(3)))
    thread.start()
    thread.join()
    assert other[0] is not dictionary.compressor(3)  # another thread's: never shared


@pytest.mark.parametrize("fmt", [3, 4, 5, 6])
def test_columnar_frames_are_compressed_at_the_fast_level_and_read_back(
    monkeypatch: pytest.MonkeyPatch, fmt: int
) -> None:
    """Formats 3 to 6 compress their frames at `COLUMNS_ZSTD_LEVEL` (format 3's token ids,
    which name no granules, at `TOKENS_ZSTD_LEVEL`); each chunk reads back as its batches."""
    rng = random.Random(9)
    pool = token_pool(rng)
    rows = block_log(rng, 300, pool) + block_log(rng, 40, pool, B)
    content = b"".join(run for block in pool for run in runs_of(block))
    known = {A: Known(0, -1, hashes_of([array("Q", [1, 2, 3])]))}
    levels: list[int] = []
    real = zstandard.ZstdCompressor

    def counted(*args: Any, **kwargs: Any) -> zstandard.ZstdCompressor:
        levels.append(kwargs["level"])
        return real(*args, **kwargs)

    monkeypatch.setattr(zstandard, "ZstdCompressor", counted)
    monkeypatch.setattr(log_compress, "_plain", threading.local())
    dictionary = Dictionary(content)
    chunks = pack(rows, fmt, {A: dictionary}, known)
    tokens = log_compress.TOKENS_ZSTD_LEVEL if fmt == 3 else log_compress.COLUMNS_ZSTD_LEVEL
    assert sorted(set(levels)) == sorted({log_compress.COLUMNS_ZSTD_LEVEL, tokens})
    monkeypatch.setattr(zstandard, "ZstdCompressor", real)
    for chunk in chunks:
        expected = [(r[2], r[3], r[4], r[5]) for r in rows if r[0] == chunk.stream]
        got = Chunk(chunk.data, dictionary if chunk.dictionary else None, known.get(chunk.stream))
        assert [tuple(b) for b in map(got.batch, range(len(got)))] == [
            e for e in expected if chunk.first_seq <= e[0] <= chunk.last_seq
        ]


@pytest.mark.parametrize(
    "size", [0, 1, 255, 256, 257, 65_791, 65_792, 65_793, 131_071, 131_072, 131_073, 300_001]
)
def test_a_raw_frame_is_zstd_s_own_for_random_bytes(size: int) -> None:
    """Bytes zstd cannot make smaller: the frame it writes for them, byte for byte."""
    data = random.Random(size).randbytes(size)
    frame = log_compress.raw_frame(data)
    assert zstandard.frame_content_size(frame) == size
    assert zstandard.ZstdDecompressor().decompress(frame) == data
    assert frame == zstandard.ZstdCompressor(level=1).compress(data)


def test_random_hash_literals_are_stored_raw_and_others_compressed() -> None:
    rng = random.Random(5)
    drawn = b"".join(rng.getrandbits(64).to_bytes(8, "big") for _ in range(400))
    counted = b"".join((1 << 40 | k).to_bytes(8, "big") for k in range(400))
    assert log_compress.random_like(drawn)
    assert not log_compress.random_like(counted)
    assert not log_compress.random_like(drawn[: 8 * (log_compress.RANDOM_SAMPLE - 1)])
