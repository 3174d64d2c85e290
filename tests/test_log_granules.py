"""Format 4 log chunks: a token block found among the stream dictionary's granules is stored as
its number there, and every payload still comes back byte for byte, whatever the dictionary
holds; migration 0016 takes them back to format 3 and up again."""

from __future__ import annotations

import random
import sys

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.storage._granules import GranuleIndex
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import CHUNK_FORMAT, SETTABLE_FORMATS, Chunk
from kvscope.storage.log_columns import FORMAT_3_MAGIC, FORMAT_4_MAGIC
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.rows import LogRow
from tests.migration_support import log_down_and_up
from tests.test_log_columns import ANY_MSGPACK, SETTINGS, rows_of
from tests.test_log_dictionary import A, block_log, runs_of, token_pool
from tests.wire_fast_strategies import batch, encoded


def unpacked(rows: list[LogRow], fmt: int, dictionary: Dictionary | None) -> list[LogRow]:
    chunks = pack(rows, fmt, {} if dictionary is None else {A: dictionary})
    assert all(c.data.startswith(FORMAT_4_MAGIC) for c in chunks) or fmt != 4
    return [
        (A, 0, *chunk.batch(i))
        for c in chunks
        for chunk in [Chunk(c.data, dictionary)]
        for i in range(len(chunk))
    ]


def pool_dictionary(pool: list[list[int]]) -> Dictionary:
    return Dictionary(b"".join(run for block in pool for run in runs_of(block)))


def test_blocks_in_the_dictionary_come_back_and_cost_a_number_each() -> None:
    rng = random.Random(7)
    pool = token_pool(rng, 2000)
    rows = block_log(rng, 600, pool)
    dictionary = pool_dictionary(pool)
    assert unpacked(rows, 4, dictionary) == rows
    size = {fmt: sum(len(c.data) for c in pack(rows, fmt, {A: dictionary})) for fmt in (3, 4)}
    assert size[4] < 0.95 * size[3]


def test_the_default_format_is_the_smallest_settable_one() -> None:
    """Checkpoints are paced by the stream's events, not by the log's bytes (a smaller log no
    longer means longer replays), so the store writes the format that takes the least disk."""
    rng = random.Random(11)
    pool = token_pool(rng, 2000)
    rows = block_log(rng, 600, pool)
    dictionary = pool_dictionary(pool)
    size = {f: sum(len(c.data) for c in pack(rows, f, {A: dictionary})) for f in SETTABLE_FORMATS}
    assert size[CHUNK_FORMAT] == min(size.values()), size


def test_only_format_4_builds_the_dictionarys_index() -> None:
    """The index of a dictionary's blocks costs about its content again in memory: reading or
    writing the other formats against a dictionary does not make one."""
    rng = random.Random(9)
    pool = token_pool(rng, 200)
    rows = block_log(rng, 100, pool)
    for fmt in (2, 3, 4):
        writer, reader = pool_dictionary(pool), pool_dictionary(pool)
        chunks = pack(rows, fmt, {A: writer})
        for c in chunks:
            Chunk(c.data, reader)
        built = [writer._granules is not None, reader._granules is not None]
        assert built == [fmt == 4, fmt == 4], fmt


def test_a_dictionary_of_anything_still_gives_every_payload_back() -> None:
    rng = random.Random(8)
    pool = token_pool(rng, 50)
    rows = block_log(rng, 200, pool)
    for content in (b"", rng.randbytes(5000), b"\xcf" * 100, pool_dictionary(pool).content[7:]):
        assert unpacked(rows, 4, Dictionary(content)) == rows
    assert unpacked(rows, 4, None) == rows


@SETTINGS
@given(st.data())
def test_vllm_shaped_batches_come_back_against_their_own_content(data: st.DataObject) -> None:
    values = data.draw(st.lists(batch(data.draw(st.booleans())), min_size=1, max_size=6))
    payloads = [encoded(data, v) for v in values]
    content = b"".join(payloads)  # granules wherever the bytes happen to parse as ones
    rows = rows_of(payloads)
    assert unpacked(rows, 4, Dictionary(content)) == rows


@SETTINGS
@given(st.lists(ANY_MSGPACK, min_size=1, max_size=6), st.lists(st.binary(max_size=30)))
def test_any_msgpack_and_any_bytes_come_back(values: list[object], junk: list[bytes]) -> None:
    payloads = [msgspec.msgpack.encode(v) for v in values]
    rows = rows_of(payloads + junk)
    assert unpacked(rows, 4, Dictionary(b"".join(payloads))) == rows


def test_0016_down_rewrites_format_4_chunks_in_format_3_and_up_again(store_url: str) -> None:
    log_down_and_up(store_url, "0016", 4, {FORMAT_4_MAGIC}, {FORMAT_3_MAGIC})


@pytest.mark.parametrize("fmt", [3, 4])
def test_every_format_reads_alongside_the_others(fmt: int) -> None:
    rng = random.Random(9)
    pool = token_pool(rng, 100)
    rows = block_log(rng, 300, pool)
    assert unpacked(rows, fmt, pool_dictionary(pool)) == rows


def test_the_index_counts_its_arrays_and_holds_one_start_per_granule() -> None:
    """`sys.getsizeof` sees the index's own arrays (the content is the dictionary's): a start
    per granule, not per granule the content's length could hold, and a table of two to four
    slots (a key and a number) per granule."""
    content = pool_dictionary(token_pool(random.Random(10), 4000)).content
    index = GranuleIndex(content)
    n = len(index)
    assert n == 4000
    slots = 12 * 2 * n
    assert 8 * (n + 1) + slots <= sys.getsizeof(index) <= 8 * (n + 1) + 2 * slots + 64
