"""Log chunk format 2: chunks compressed against their stream's dictionary of token content.

What is checked here needs no store: the token runs a payload yields, format 2's round trip,
when a stream's dictionary is made again, and which dictionaries go with a transaction.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
import zstandard

from kvscope.collector.types import StreamId
from kvscope.storage._token_granules import RunTable
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk, ChunkError, named_dictionary
from kvscope.storage.log_dictionary import (
    GRANULE,
    SAMPLE,
    Dictionary,
    StreamContent,
    from_stored,
    row_of,
)
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow, Row
from kvscope.storage.sql_writer import RowWriter

A, B = StreamId("a", 0), StreamId("b", 0)
WIDTHS = (5, 200, 40_000, 3_000_000_000)
"""Token ids of each msgpack int width (fixint, uint8, uint16, uint32)."""


def stored(tokens: list[int], hashes: list[int], layout: str = "map") -> Any:
    """A vLLM BlockStored event, in the map layout (vLLM >= 0.10) or the array one."""
    if layout == "array":
        return ["BlockStored", hashes, None, tokens, GRANULE, None]
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": GRANULE,
        "lora_id": None,
        "medium": "GPU",
    }


def removed(hashes: list[int], layout: str = "map") -> Any:
    if layout == "array":
        return ["BlockRemoved", hashes]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def payload(events: list[Any], ts: float = 1.0) -> bytes:
    return msgspec.msgpack.encode([ts, events, 0])


def runs_of(tokens: list[int]) -> list[bytes]:
    """Each whole run of GRANULE ids as msgpack encodes it in an array, without the header."""
    header = len(msgspec.msgpack.encode([0] * GRANULE)) - GRANULE
    return [
        msgspec.msgpack.encode(tokens[i : i + GRANULE])[header:]
        for i in range(0, len(tokens) - GRANULE + 1, GRANULE)
    ]


@pytest.mark.parametrize("layout", ["map", "array"])
def test_token_runs_are_read_from_either_layout_and_hashes_are_not(layout: str) -> None:
    rng = random.Random(3)
    tokens = [rng.choice(WIDTHS) + rng.randrange(3) for _ in range(3 * GRANULE + 5)]
    other = [rng.choice(WIDTHS) for _ in range(GRANULE)]
    hashes = [rng.getrandbits(64) | 1 << 63 for _ in range(20)]  # 64-bit: not token ids
    events = [
        stored(tokens, hashes[:3], layout),
        removed(hashes, layout),
        stored(other, hashes[3:4], layout),
    ]
    runs = runs_of(tokens) + runs_of(other)
    seen = RunTable(GRANULE)
    size = sum(map(len, runs))
    assert seen.note([payload(events)], 1, 1) == (size, 0)
    assert seen.seen() == dict.fromkeys(runs, 1)
    # Seen again: nothing new, all of it recurred, and noted as seen then (the most recent
    # last, of those seen together the first seen first).
    assert seen.note([payload(events[:1])], 1, 2) == (0, sum(map(len, runs[:3])))
    assert list(seen.seen().items()) == [(run, 1) for run in runs[3:]] + [
        (run, 2) for run in runs[:3]
    ]


def test_token_runs_of_what_is_no_batch_are_none_or_some_and_never_fail() -> None:
    rng = random.Random(5)
    for n in range(300):
        seen = RunTable(GRANULE)
        new, _ = seen.note([rng.randbytes(n)], 1, 1)
        assert new == sum(map(len, seen.runs())) == len(seen.content())
    cut = RunTable(GRANULE)
    first = stored(list(range(GRANULE)), [1])
    tokens_last = ["BlockStored", [2], None, list(range(GRANULE, 3 * GRANULE))]
    whole = msgspec.msgpack.encode([1.0, [first, tokens_last]])
    cut.note([whole[:-5]], 1, 1)  # an array cut short is no token ids
    assert cut.runs() == runs_of(list(range(GRANULE)))


def block_log(
    rng: random.Random, n: int, pool: list[list[int]], stream: StreamId = A
) -> list[LogRow]:
    """Batches whose blocks' tokens come from `pool`: content that recurs across chunks."""
    rows: list[LogRow] = []
    for seq in range(n):
        blocks = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
        hashes = [rng.getrandbits(64) for _ in blocks]
        body = payload([stored([t for b in blocks for t in b], hashes), removed(hashes[:1])])
        rows.append((stream, 0, seq, 1000.0 + seq / 100, 1000.0 + seq / 100, body))
    return rows


def token_pool(rng: random.Random, size: int = 300) -> list[list[int]]:
    return [[rng.randrange(128_000) for _ in range(GRANULE)] for _ in range(size)]


def test_format_2_keeps_every_batch_and_needs_its_dictionary() -> None:
    rng = random.Random(11)
    pool = token_pool(rng)
    rows = block_log(rng, 900, pool) + block_log(rng, 50, pool, B)
    dictionary = Dictionary(b"".join(run for block in pool for run in runs_of(block)))
    chunks = pack(rows, 2, {A: dictionary})
    plain = pack(rows, 2)
    for chunk, alone in zip(chunks, plain, strict=True):
        expected = [(r[2], r[3], r[4], r[5]) for r in rows if (r[0], r[1]) == (chunk.stream, 0)]
        expected = [r for r in expected if chunk.first_seq <= r[0] <= chunk.last_seq]
        if chunk.stream == B:  # B has no dictionary: format 2 without one
            assert chunk.dictionary is None and named_dictionary(chunk.data) is None
            opened = Chunk(chunk.data)
        else:
            assert chunk.dictionary == named_dictionary(chunk.data) == dictionary.digest
            assert len(chunk.data) < 0.85 * len(alone.data)  # the dictionary finds more
            with pytest.raises(ChunkError, match="needs dictionary"):
                Chunk(chunk.data)
            with pytest.raises(ChunkError, match="needs dictionary"):
                Chunk(chunk.data, Dictionary(b"other content"))
            opened = Chunk(chunk.data, dictionary)
        got = [tuple(opened.batch(i)) for i in range(len(opened))]
        assert got == expected
    # Format 1 is still written on demand (the migration down) and read as before.
    old = pack(rows[:10], 1)[0]
    assert named_dictionary(old.data) is None and old.dictionary is None
    assert Chunk(old.data).payloads == [r[5] for r in rows[:10]]


def seen_twice(content: StreamContent, blocks: list[list[int]]) -> None:
    for _ in range(2):
        content.see([payload([stored(block, [1])]) for block in blocks])


def one_run_each(runs: list[list[int]]) -> list[bytes]:
    return [payload([stored(run, [1])]) for run in runs]


def test_content_is_bounded_and_most_recent_last() -> None:
    content = StreamContent(cap=10 * 3 * GRANULE, ratio=0.0)  # ten runs of uint16 ids
    runs = [[1000 * k + i for i in range(GRANULE)] for k in range(1, 13)]
    content.see(one_run_each(runs[:10]))
    content.see(one_run_each([runs[5], runs[10]]))  # past the cap: down to 7/8 of it
    content.see(one_run_each([runs[0], runs[11]]))
    kept = [runs[k] for k in (3, 4, 6, 7, 8, 9, 5, 10, 0, 11)]  # the oldest made room
    assert content.runs() == [run for r in kept for run in runs_of(r)]


def test_steady_content_is_noted_from_a_sample_until_it_changes() -> None:
    content = StreamContent(cap=10 * 3 * GRANULE, ratio=0.0)
    runs = [[1000 * k + i for i in range(GRANULE)] for k in range(1, 11)]
    content.see(one_run_each(runs))
    content.see(one_run_each(runs))  # all seen before, and the cap full: steady
    new = [[50_000 + 100 * k + i for i in range(GRANULE)] for k in range(2 * SAMPLE)]
    content.see(one_run_each(new))
    held = set(content.runs())
    assert [k for k, run in enumerate(new) if runs_of(run)[0] in held] == [0, SAMPLE]
    content.see(one_run_each(new[1:3]))  # it changed: every batch again
    held = set(content.runs())
    assert runs_of(new[1])[0] in held and runs_of(new[2])[0] in held


def test_a_dictionary_is_made_when_content_recurs_and_enough_log_paid_for_it() -> None:
    rng = random.Random(2)
    content = StreamContent(cap=1 << 20, ratio=2.0)  # a dictionary <= the log since, stored
    assert content.refresh() is None  # nothing seen yet
    first_pool = token_pool(rng, 100)
    content.see([payload([stored(b, [1])]) for b in first_pool])
    size = sum(len(run) for b in first_pool for run in runs_of(b))
    content.stored(10 * size)
    assert content.refresh() is None  # nothing recurred: a dictionary would only cost
    content.see([payload([stored(b, [1])]) for b in first_pool])
    first = content.refresh()
    assert first is not None and content.current is first
    assert first.content == b"".join(run for b in first_pool for run in runs_of(b))
    seen_twice(content, first_pool)
    assert content.refresh() is None  # no log stored against it yet
    content.stored(4 * size)
    assert content.refresh() is None  # nothing new seen: the same content again
    few = token_pool(rng, 5)
    seen_twice(content, few)
    assert content.refresh() is None  # too little new: hardly another dictionary
    more = token_pool(rng, 30)
    seen_twice(content, more)
    second = content.refresh()
    assert second is not None and second.digest != first.digest
    runs = {run for b in first_pool + few + more for run in runs_of(b)}
    assert len(second.content) == sum(map(len, runs))  # all of it, each run once
    assert second.content.endswith(b"".join(run for b in more for run in runs_of(b)))
    seen_twice(content, first_pool + few + more + token_pool(rng, 100))
    content.stored(2 * size)
    assert content.refresh() is None  # the log stored since would not pay for a larger one
    content.stored(size)
    assert content.refresh() is not None


def test_no_content_kept_with_a_cap_of_zero() -> None:
    content = StreamContent(cap=0)
    content.see([payload([stored(list(range(GRANULE)), [1])])])
    assert content.refresh() is None


def test_a_dictionary_goes_with_every_transaction_naming_it_until_one_commits() -> None:
    rng = random.Random(8)
    pool = token_pool(rng, 40)
    rows = block_log(rng, 400, pool)
    packer = LogPacker(ratio=0.5)
    chunks, dictionaries = packer.pack(rows[:100])
    assert [c.dictionary for c in chunks] == [None] and dictionaries == []
    chunks, dictionaries = packer.pack(rows[100:200])
    (made,) = dictionaries
    assert [c.dictionary for c in chunks] == [made.digest] and made.stream == A
    assert from_stored(made.data).digest == made.digest  # the row alone gives it back
    chunks, again = packer.pack(rows[200:300])  # the last transaction may have failed
    assert again == [made] and {c.dictionary for c in chunks} == {made.digest}
    packer.committed(again)
    chunks, after = packer.pack(rows[300:])
    assert after == [] and {c.dictionary for c in chunks} == {made.digest}
    packer.forget(A)  # the stream went to another collector, and came back
    chunks, after = packer.pack(rows[:10])
    assert [c.dictionary for c in chunks] == [None] and after == []


def test_a_stream_that_left_the_writer_takes_its_content_along() -> None:
    """Its lease moved away (storage/write_loop.py's forget): the writer keeps no content for
    it, and were it to come back, a new dictionary is made from what it shows then."""
    rng = random.Random(8)
    rows = block_log(rng, 300, token_pool(rng, 40))
    writer = RowWriter(None, packer=LogPacker(ratio=0.5))
    for start in (0, 100):
        writer.committed(writer.prepare(list[Row](rows[start : start + 100])))
    assert writer.packer.current()
    writer.forget_stream(A)
    assert not writer.packer.current()
    chunks = writer.prepare(list[Row](rows[200:])).chunks
    assert [c.dictionary for c in chunks] == [None]


def test_a_dictionary_s_content_is_its_granule_index_s_once_that_is_made() -> None:
    """Each read of zstd's copy makes another: those who read it share the index's instead."""
    dictionary = Dictionary(b"".join(msgspec.msgpack.encode(i) for i in range(GRANULE * 4)))
    assert len(dictionary.granules) == 4
    assert dictionary.content is dictionary.content
    assert dictionary.content == dictionary.zstd.as_bytes()


def test_a_dictionary_row_stored_at_an_earlier_level_reads_back() -> None:
    # Rows stored before `STORED_LEVEL` changed hold the content at level 3: any level reads.
    content = b"".join(msgspec.msgpack.encode(i) for i in range(40_000))
    new = row_of(StreamId("s", 0), Dictionary(content), 1.0)
    old = new._replace(data=zstandard.ZstdCompressor(level=3).compress(content))
    for row in (new, old):
        found = from_stored(row.data)
        assert found.content == content and found.digest == row.digest
