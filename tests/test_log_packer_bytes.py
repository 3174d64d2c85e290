"""The bytes the writer's log packing stores, pinned: the chunks, dictionaries and their order
for a fixed stream of two streams' batches, against a digest of what main's packing wrote
before the content noting moved into C. A change of any stored byte (a run noted or dropped
otherwise, a dictionary's content in another order, a chunk's columns) shows here; a change
meant to alter them must say so and pin the new digest."""

from __future__ import annotations

import hashlib
import random

from kvscope.collector.types import StreamId
from kvscope.storage.log_dictionary import GRANULE
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow
from tests.test_log_dictionary import payload, removed, stored

A, B = StreamId("a", 0), StreamId("b", 0)
PINNED = "a76467d5e02e7c71d7c81244d89d1f824190cbbeea77c9f239b14ba37f906bc3"
"""sha256 of the chunks and dictionaries main packed (0e4fca1), before the noting moved."""


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


def packed_digest() -> str:
    rng = random.Random(16)
    rows = batches(rng, 2400)
    packer = LogPacker(cap=12_000, ratio=0.5)
    digest = hashlib.sha256()
    start = 0
    while start < len(rows):
        end = start + rng.randint(20, 90)
        chunks, dictionaries = packer.pack(rows[start:end])
        for chunk in chunks:
            digest.update(repr((chunk.stream, chunk.first_seq, chunk.last_seq)).encode())
            digest.update(chunk.dictionary or b"-")
            digest.update(chunk.data)
        for row in dictionaries:
            digest.update(repr((row.stream, row.raw_bytes)).encode() + row.digest + row.data)
        if start % 3 == 0:
            packer.committed(dictionaries)
        start = end
    return digest.hexdigest()


def test_packed_bytes_are_main_s() -> None:
    assert packed_digest() == PINNED
