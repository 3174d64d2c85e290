"""The bytes the writer's log packing stores, pinned: the chunks, dictionaries and their order
for a fixed stream of two streams' batches, against a digest of what main's packing wrote
(pinned again when the columnar frames' zstd level changed, and again the dictionary rows').
A change of any stored byte (a run noted or dropped otherwise, a dictionary's content in
another order, a chunk's columns) shows here; a change meant to alter them must say so and pin
the new digest. The frames unpacked are pinned apart, and every chunk must read back as its
batches: a change of zstd's level alone leaves both as they were."""

from __future__ import annotations

import hashlib
import random

import zstandard

from kvscope.collector.types import StreamId
from kvscope.storage.log_chunks import Chunk, ChunkRow
from kvscope.storage.log_columns import FORMAT_6_MAGIC, FRAMES, TOKENS, _get_varint
from kvscope.storage.log_dictionary import GRANULE, Dictionary, from_stored
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow
from tests.test_log_dictionary import payload, removed, stored

A, B = StreamId("a", 0), StreamId("b", 0)
PINNED = "48195b8c07988175ad5d388edf37a4cbd4c2388a7595fcbe665ec5f746f8d100"
"""sha256 of the chunks and dictionaries packed with the columnar frames at zstd's level 1, and
the dictionary rows at level 1 too (`log_dictionary.STORED_LEVEL`: the chunks' bytes as before)."""
UNPACKED = "259a60dc7879cc4ff61d2e52ee847d68485e8f1d53ef0eaa57b2a9939ac51be6"
"""sha256 of the same chunks' frames unpacked, and the dictionaries' content: main's (95bbe97),
packed at the levels before."""


def batches(rng: random.Random, n: int) -> list[LogRow]:
    """Blocks from a pool that shifts over time (content recurs, grows past the cap, and holds
    steady for a while), ids of every msgpack width, now and then a batch of stream B."""
    pool = [[rng.randrange(70_000) for _ in range(GRANULE)] for _ in range(120)]
    rows: list[LogRow] = []
    for seq in range(n):
        if seq and seq % 150 == 0:  # content moves on
            pool = pool[20:] + [[rng.randrange(1 << 32) for _ in range(GRANULE)] for _ in range(20)]
        stream = B if seq % 7 == 3 else A
        blocks = [rng.choice(pool) for _ in range(rng.randint(1, 5))]
        tail = [rng.randrange(300) for _ in range(rng.randrange(GRANULE))]
        hashes = [rng.getrandbits(64) for _ in blocks]
        events = [stored([t for b in blocks for t in b] + tail, hashes), removed(hashes[:1])]
        at = 1000.0 + seq / 64
        rows.append((stream, 0, seq, at, at + 0.001, payload(events, at)))
    return rows


def packed_digest() -> tuple[str, str]:
    """The digests of the bytes stored and of the frames unpacked; each chunk checked to read
    back as its batches."""
    rng = random.Random(16)
    rows = batches(rng, 2400)
    packer = LogPacker(cap=12_000, ratio=0.5)
    digest, unpacked = hashlib.sha256(), hashlib.sha256()
    made: dict[bytes, Dictionary] = {}
    start = 0
    while start < len(rows):
        end = start + rng.randint(20, 90)
        chunks, dictionaries = packer.pack(rows[start:end])
        for row in dictionaries:
            made.setdefault(row.digest, from_stored(row.data))
        for chunk in chunks:
            digest.update(repr((chunk.stream, chunk.first_seq, chunk.last_seq)).encode())
            digest.update(chunk.dictionary or b"-")
            digest.update(chunk.data)
            against = made[chunk.dictionary] if chunk.dictionary else None
            for frame in frames_unpacked(chunk, against):
                unpacked.update(len(frame).to_bytes(8, "little") + frame)
            read = Chunk(chunk.data, against)
            assert [tuple(read.batch(i)) for i in range(len(read))] == [
                (r[2], r[3], r[4], r[5])
                for r in rows[start:end]
                if r[0] == chunk.stream and chunk.first_seq <= r[2] <= chunk.last_seq
            ]
        for row in dictionaries:
            digest.update(repr((row.stream, row.raw_bytes)).encode() + row.digest + row.data)
            unpacked.update(made[row.digest].content)
        if start % 3 == 0:
            packer.committed(dictionaries)
        start = end
    return digest.hexdigest(), unpacked.hexdigest()


def frames_unpacked(chunk: ChunkRow, dictionary: Dictionary | None) -> list[bytes]:
    """A columnar chunk's frames, unpacked (the token ids' against `dictionary`)."""
    out = []
    for i, frame in enumerate(frames_packed(chunk.data)):
        zdict = dictionary.zstd if i == TOKENS and dictionary is not None else None
        out.append(zstandard.ZstdDecompressor(dict_data=zdict).decompress(frame))
    return out


def frames_packed(data: bytes) -> list[bytes]:
    """A columnar chunk's zstd frames, as its header cuts them."""
    pos = 5 + data[4]
    if data[:4] == FORMAT_6_MAGIC:
        pos += 1 + data[pos]
        n, pos = _get_varint(data, pos)
    else:
        n = FRAMES[data[:4]]
    _, pos = _get_varint(data, pos)
    lengths = []
    for _ in range(n):
        length, pos = _get_varint(data, pos)
        lengths.append(length)
    out = []
    for length in lengths:
        out.append(data[pos : pos + length])
        pos += length
    assert pos == len(data)
    return out


def test_packed_bytes_are_pinned_and_unpack_as_main_s() -> None:
    assert packed_digest() == (PINNED, UNPACKED)
