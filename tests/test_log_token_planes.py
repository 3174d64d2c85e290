"""Format 5 log chunks: a chunk without a dictionary keeps its token ids as byte planes, and
every payload still comes back byte for byte (ids of any width and form, anything msgpack,
bytes that are not msgpack, the recordings); a chunk against a dictionary is format 4's; and
migration 0018 takes format 5 chunks back to format 4 and up again."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector.capture import read_capture
from kvscope.storage._log_planes import token_planes, tokens_of_planes
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk
from kvscope.storage.log_columns import FORMAT_4_MAGIC, FORMAT_5_MAGIC
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.rows import LogRow
from tests.conftest import capture_path
from tests.migration_support import log_down_and_up
from tests.test_log_columns import ANY_MSGPACK, SETTINGS, rows_of
from tests.test_log_dictionary import A, block_log, token_pool
from tests.wire_fast_strategies import batch, encoded


def unpacked(rows: list[LogRow], dictionary: Dictionary | None = None) -> list[LogRow]:
    chunks = pack(rows, 5, {} if dictionary is None else {A: dictionary})
    return [
        (A, 0, *chunk.batch(i))
        for c in chunks
        for chunk in [Chunk(c.data, dictionary)]
        for i in range(len(chunk))
    ]


def recording(name: str) -> list[LogRow]:
    return rows_of([record.frames[-1] for record in read_capture(capture_path(name))])


@pytest.mark.parametrize("name", ["lab_10rps_300s.msgpack.gz", "lab_3rps_180s.msgpack.gz"])
def test_a_recording_without_a_dictionary_comes_back_from_fewer_bytes(name: str) -> None:
    """A short recording never forms a dictionary, and its token ids hardly recur: as msgpack
    bytes zstd codes them no better than a byte at a time; as planes each byte of an id is
    coded by what that byte alone is."""
    rows = recording(name)
    chunks = pack(rows, 5)
    assert all(c.data.startswith(FORMAT_5_MAGIC) for c in chunks)
    assert unpacked(rows) == rows
    size = {fmt: sum(len(c.data) for c in pack(rows, fmt)) for fmt in (4, 5)}
    assert size[5] < 0.95 * size[4], size


def test_against_a_dictionary_a_chunk_is_format_4s() -> None:
    """The dictionary holds msgpack's bytes of the ids, which planes would no longer match."""
    rng = random.Random(7)
    pool = token_pool(rng, 300)
    rows = block_log(rng, 300, pool)
    dictionary = Dictionary(b"".join(r[5] for r in rows[:40]))
    five = pack(rows, 5, {A: dictionary})
    assert [c.data for c in five] == [c.data for c in pack(rows, 4, {A: dictionary})]
    assert unpacked(rows, dictionary) == rows


def test_ids_that_planes_cannot_give_back_are_kept_as_they_came() -> None:
    """Negative ids, ids of 4 bytes, and ids not in msgpack's shortest form."""
    payloads = [
        msgspec.msgpack.encode([1.0, [[7, 300, -5, 70000]]]),
        msgspec.msgpack.encode([1.0, [[2**30, 1, 2]]]),
        b"\x92\xcb" + bytes(8) + b"\x93\xcd\x00\x05\x01\x02",  # 5 as a uint16
        b"\x92\xcb" + bytes(8) + b"\x92\xcc\x05\x01",  # 5 as a uint8
    ]
    for payload in payloads:
        assert unpacked(rows_of([payload])) == rows_of([payload])
    fits = msgspec.msgpack.encode([1.0, [[0, 127, 128, 255, 256, 65535, 65536, 2**24 - 1]]])
    rows = rows_of([fits, *payloads])
    assert unpacked(rows) == rows


@given(st.lists(st.integers(0, 2**24 - 1), max_size=300))
def test_planes_give_every_id_in_its_shortest_form_back(ids: list[int]) -> None:
    column = b"".join(msgspec.msgpack.encode(i) for i in ids)
    planes = token_planes(column)
    assert planes is not None
    low, rest = planes
    assert len(low) == len(ids) and rest[0] in (1, 2, 3)
    assert tokens_of_planes(low, rest) == column


def test_planes_that_do_not_fit_together_are_refused() -> None:
    low, rest = token_planes(msgspec.msgpack.encode(300) * 4) or (b"", b"")
    for bad in ((low, rest[:-1]), (low[:-1], rest), (low, b""), (low, b"\x04" + rest[1:])):
        with pytest.raises(ValueError):
            tokens_of_planes(*bad)


@SETTINGS
@given(st.lists(ANY_MSGPACK, min_size=1, max_size=6), st.lists(st.binary(max_size=30)))
def test_any_msgpack_and_any_bytes_come_back(values: list[object], junk: list[bytes]) -> None:
    rows = rows_of([msgspec.msgpack.encode(v) for v in values] + junk)
    assert unpacked(rows) == rows


@SETTINGS
@given(st.data())
def test_vllm_shaped_batches_come_back(data: st.DataObject) -> None:
    values = data.draw(st.lists(batch(data.draw(st.booleans())), min_size=1, max_size=6))
    rows = rows_of([encoded(data, v) for v in values])
    assert unpacked(rows) == rows


def test_0018_down_rewrites_format_5_chunks_in_format_4_and_up_again(store_url: str) -> None:
    """A stream's chunks without a dictionary are format 5 (stream b's: it has none yet; a's
    before its first are packed again against it), with one format 4's."""
    log_down_and_up(
        store_url, "0018", 5, {FORMAT_4_MAGIC, FORMAT_5_MAGIC}, {FORMAT_4_MAGIC}, second_stream=True
    )
