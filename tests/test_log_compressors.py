"""Format 2's compressors are made once per dictionary and thread, not once per transaction,
and the chunks they make are byte for byte those of fresh ones."""

from __future__ import annotations

import random
import threading
from array import array
from typing import Any

import msgspec
import pytest
import zstandard

from kvscope.storage import log_columns, log_compress
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_known import Known, hashes_of
from tests.test_log_dictionary import A, B, block_log, runs_of, token_pool
from tests.test_log_packer_bytes import frames_packed


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
        params = kwargs.get("compression_params")  # (those leaving their literals raw)
        levels.append(kwargs["level"] if params is None else params.compression_level)
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


def _literal_kinds(frame: bytes) -> set[int]:
    """The literals section types of a zstd frame's compressed blocks (0 raw, 1 RLE, 2 Huffman
    coded, 3 Huffman with the table before), read from its frame and block headers."""
    assert frame[:4] == log_compress.ZSTD_MAGIC
    fhd = frame[4]
    single = (fhd >> 5) & 1
    pos = 5 + (not single) + (0, 1, 2, 4)[fhd & 3] + ((single, 2, 4, 8)[fhd >> 6])
    kinds: set[int] = set()
    last = False
    while not last:
        head = int.from_bytes(frame[pos : pos + 3], "little")
        last, kind, size = bool(head & 1), (head >> 1) & 3, head >> 3
        pos += 3
        if kind == 2:  # compressed: its literals section's header comes first
            kinds.add(frame[pos] & 3)
        pos += 1 if kind == 1 else size
    assert pos == len(frame)
    return kinds


@pytest.mark.parametrize("planes", [False, True])
def test_frames_of_bytes_drawn_at_random_leave_their_literals_uncoded(planes: bool) -> None:
    """The frame whose bytes zstd's matches leave are random (the positions among known
    hashes) is compressed with zstd's Huffman stage off (it would cost a table a block and
    shrink it hardly at all); the others keep it, and every chunk reads back as its batches."""
    rng = random.Random(11)
    pool = [[rng.randrange(1 << 17) for _ in range(16)] for _ in range(400)]
    rows = block_log(rng, 600, pool)
    hashes = [rng.getrandbits(64) for _ in range(3_000)]
    known = {A: Known(0, -1, hashes_of([array("Q", hashes)]))}
    removals = [
        (
            A,
            0,
            600 + k,
            1006.0 + k / 100,
            1006.0 + k / 100,
            msgspec.msgpack.encode([1.0, hashes[k::50]]),
        )
        for k in range(50)
    ]
    content = b"".join(run for block in pool[:200] for run in runs_of(block))
    dictionaries = {} if planes else {A: Dictionary(content)}
    chunks = pack(rows + removals, 6, dictionaries, known)
    assert len(chunks) == 1
    frames = frames_packed(chunks[0].data)
    uncoded = log_columns.literals_left_raw(len(frames), True)
    assert len(frames) == (11 if planes else 10)
    assert uncoded == ((10,) if planes else (9,))
    for k in uncoded:
        assert _literal_kinds(frames[k]) <= {0, 1}, k
    assert _literal_kinds(frames[2]) & {2, 3}  # the skeleton's literals stay coded
    read = Chunk(chunks[0].data, dictionaries.get(A), known[A])
    assert [tuple(b) for b in map(read.batch, range(len(read)))] == [
        (r[2], r[3], r[4], r[5]) for r in rows + removals
    ]


@pytest.mark.parametrize("coded", [True, False])
def test_frames_come_back_in_their_items_order_as_each_alone_would_be(coded: bool) -> None:
    """`compress_all` compresses the largest items first (zstd's context is then sized once
    per call): each frame is still its own item's, byte for byte what a fresh compressor
    makes of it alone, and in the items' order."""
    rng = random.Random(3)
    items = [
        bytes(rng.randrange(6) for _ in range(rng.choice([0, 9, 800, 70_000]))) for _ in range(40)
    ]
    fresh = log_compress.plain_compressor(1, coded)
    alone = [bytes(fresh.compress(item)) for item in items]
    assert [bytes(f) for f in log_compress.compress_all(None, items, 1, coded)] == alone
    for frame, item in zip(alone, items, strict=True):
        assert zstandard.ZstdDecompressor().decompress(frame) == item
