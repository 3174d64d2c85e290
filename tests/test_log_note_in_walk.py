"""The log packing notes each stream's content inside the columns' walk (one let-go of the GIL
for both): what it notes, the dictionaries made of it and the chunks packed against them must
be what noting after the packing gave, byte for byte, for any batches: vLLM's layouts, ids of
every width (negative ones, small ones as 64-bit ints), nesting past the walk's depth, bytes
that are not msgpack, several streams, content that holds steady (sampled) and moves on."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from kvscope.collector.types import StreamId
from kvscope.storage import _log_columns
from kvscope.storage.log_dictionary import GRANULE
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow
from tests.test_log_dictionary import payload, removed, stored

STREAMS = [StreamId("a", 0), StreamId("b", 0), StreamId("c", 1)]


def _u64(v: int) -> bytes:
    return b"\xcf" + v.to_bytes(8, "big")


def odd_payload(rng: random.Random, tokens: list[int]) -> bytes:
    """A payload the usual walks read otherwise: ids as 64-bit ints, negative ids, nesting
    past the depth limit, a value after the first, bytes cut short or not msgpack."""
    kind = rng.randrange(6)
    ids = msgspec.msgpack.encode(tokens)
    if kind == 0:  # an array of small ids, one of them a 64-bit int
        head = msgspec.msgpack.encode([0] * len(tokens))[: -len(tokens)]
        body = b"".join(msgspec.msgpack.encode(t) for t in tokens[:-1]) + _u64(tokens[-1])
        return msgspec.msgpack.encode([1.0, 0])[:1] + b"\x92" + head + body + b"\xc0"
    if kind == 1:
        return payload([stored([-t for t in tokens], [rng.getrandbits(64)])])
    if kind == 2:
        deep: Any = tokens
        for _ in range(rng.randrange(60, 70)):
            deep = [deep, 1]
        return msgspec.msgpack.encode(deep)
    if kind == 3:
        return ids + ids  # the second value is not walked by the note
    if kind == 4:
        return payload([stored(tokens, [rng.getrandbits(64)])])[:-3]
    return b"\xc1" + ids


def batches(rng: random.Random, n: int, odd: float) -> list[LogRow]:
    pool = [[rng.randrange(70_000) for _ in range(GRANULE)] for _ in range(60)]
    rows: list[LogRow] = []
    for seq in range(n):
        if seq and seq % 120 == 0:
            pool = pool[10:] + [[rng.randrange(1 << 32) for _ in range(GRANULE)] for _ in range(10)]
        stream = rng.choice(STREAMS) if rng.random() < 0.3 else STREAMS[0]
        blocks = [rng.choice(pool) for _ in range(rng.randint(1, 4))]
        tokens = [t for b in blocks for t in b] + [rng.randrange(300) for _ in range(7)]
        hashes = [rng.getrandbits(64) for _ in blocks]
        if rng.random() < odd:
            data = odd_payload(rng, tokens)
        else:
            layout = "array" if rng.random() < 0.3 else "map"
            events = [stored(tokens, hashes, layout), removed(hashes[:1], layout)]
            data = payload(events, 1000.0 + seq)
        rows.append((stream, 0, seq, 1000.0 + seq / 64, 1000.0 + seq / 64, data))
    return rows


CASES = [(1, 0.0, 6), (2, 0.05, 6), (3, 0.3, 5), (4, 0.1, 3)]
"""(seed, share of odd payloads, chunk format)."""


def packed(packer: LogPacker, rows: list[LogRow]) -> tuple[Any, ...]:
    """What `pack` gives, the dictionaries' times of making left out."""
    chunks, made = packer.pack(rows)
    return chunks, [row._replace(made_at=0.0) for row in made]


@pytest.mark.parametrize(("seed", "odd", "fmt"), CASES)
def test_noting_in_the_walk_stores_the_same_bytes(seed: int, odd: float, fmt: int) -> None:
    rng = random.Random(seed)
    rows = batches(rng, 1500, odd)
    fused = LogPacker(cap=6_000, ratio=0.5, fmt=fmt)
    apart = LogPacker(cap=6_000, ratio=0.5, fmt=fmt)
    apart.note_in_walk = False
    made = 0
    start = 0
    while start < len(rows):
        end = start + rng.randint(1, 80)
        got = packed(fused, rows[start:end])
        assert got == packed(apart, rows[start:end])
        made += len(got[1])
        for stream in STREAMS:
            if stream in apart._streams:
                assert fused._streams[stream].table.seen() == apart._streams[stream].table.seen()
        start = end
    assert made > 3  # dictionaries were made, and chunks packed against them


def test_noting_lets_go_of_the_gil_once_with_the_walk() -> None:
    rows = batches(random.Random(5), 60, 0.0)
    packer = LogPacker(cap=6_000, ratio=0.5)
    before = _log_columns.walks_let_go()
    packer.pack(rows)
    assert _log_columns.walks_let_go() - before == 1
    table = packer._streams[STREAMS[0]].table
    assert table.noted is not None and table.noted[0] > 0


def test_out_of_memory_in_one_note_lets_every_table_go() -> None:
    rows = batches(random.Random(6), 200, 0.0)
    packer = LogPacker(cap=6_000, ratio=0.5)
    packer.pack(rows[:100])
    tables = [packer._streams[stream].table for stream in STREAMS]
    tables[0].fail_allocations_after(0)
    with pytest.raises(MemoryError):
        packer.pack(rows[100:])
    tables[0].fail_allocations_after(-1)
    for table in tables:
        table.runs()  # not left busy


def test_walks_done_before_one_ran_out_of_memory_are_counted() -> None:
    # Every walk runs in one let-go: where one stream's runs out of memory, the others' have
    # noted their runs all the same, and their contents must count them (else they hold more
    # than their cap says, for good).
    rows = batches(random.Random(6), 200, 0.0)
    packer = LogPacker(cap=6_000, ratio=0.5)
    packer.pack(rows[:100])
    order = list(dict.fromkeys(row[0] for row in rows[100:]))
    failing = packer._streams[order[-1]].table
    failing.fail_allocations_after(0)
    with pytest.raises(MemoryError):
        packer.pack(rows[100:])
    failing.fail_allocations_after(-1)
    for stream in order[:-1]:
        content = packer._streams[stream]
        assert not content.pending()
        assert content._held == sum(map(len, content.runs()))
