"""Format 3 log chunks give every payload back byte for byte: vLLM-shaped batches (0.24 to
0.33, with every msgpack width a sender may pick), anything msgpack, bytes that are not msgpack,
and the recordings; and migration 0015 takes them back to format 2 and up again."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.collector.capture import read_capture
from kvscope.storage._log_columns import join, split
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import FORMAT_2_MAGIC, Chunk
from kvscope.storage.log_columns import FORMAT_3_MAGIC
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.rows import LogRow
from tests.conftest import capture_path
from tests.migration_support import log_down_and_up
from tests.test_log_dictionary import A
from tests.wire_fast_strategies import batch, encoded

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ANY_MSGPACK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=60,
)


def rows_of(payloads: list[bytes]) -> list[LogRow]:
    return [(A, 0, i, 1000.0 + i / 7, 1003.0 + i / 5, p) for i, p in enumerate(payloads)]


def round_trip(payloads: list[bytes], dictionary: Dictionary | None = None) -> None:
    """Through the split alone, and through a chunk as stored."""
    columns, _ = split(payloads)
    assert join(len(payloads), *columns) == payloads
    rows = rows_of(payloads)
    chunks = pack(rows, 3, {} if dictionary is None else {A: dictionary})
    back = [
        (A, 0, *b)
        for chunk in chunks
        for b in (lambda c: [c.batch(i) for i in range(len(c))])(Chunk(chunk.data, dictionary))
    ]
    assert all(c.data.startswith(FORMAT_3_MAGIC) for c in chunks)
    assert back == rows


@SETTINGS
@given(st.data())
def test_vllm_shaped_batches_come_back_byte_for_byte(data: st.DataObject) -> None:
    wild = data.draw(st.booleans())
    values = data.draw(st.lists(batch(wild), min_size=1, max_size=6))
    round_trip([encoded(data, v) for v in values])


@SETTINGS
@given(st.lists(ANY_MSGPACK, min_size=1, max_size=6), st.lists(st.binary(max_size=30)))
def test_any_msgpack_and_any_bytes_come_back(values: list[object], junk: list[bytes]) -> None:
    payloads = [msgspec.msgpack.encode(v) for v in values]
    round_trip(payloads + junk + payloads)


def test_what_is_not_msgpack_is_kept_verbatim() -> None:
    payloads = [
        b"\xc1",
        b"\xda\x00\x05ab",
        b"\xcf\x00",
        msgspec.msgpack.encode([1.5, [2**63, 2**63]]),
    ]
    columns, verbatim = split(payloads)
    assert verbatim == 3
    assert join(4, *columns) == payloads


def test_hashes_repeated_in_a_chunk_are_stored_once() -> None:
    rng = random.Random(1)
    hashes = [rng.getrandbits(64) | 1 << 63 for _ in range(50)]
    payloads = [msgspec.msgpack.encode([1.0, [{"h": hashes, "p": hashes[-1]}]])] * 3
    (_, _, refs, literals, _, _), verbatim = split(payloads)
    assert verbatim == 0 and len(literals) == 8 * 50 and len(refs) >= 3 * 51
    assert join(3, *split(payloads)[0]) == payloads


def test_a_chunk_of_many_distinct_hashes_still_stores_each_once() -> None:
    """Past the hash table's first size (it grows as distinct hashes come): every hash seen
    before in the chunk is a reference, never a literal again; and a payload kept verbatim
    after some of its hashes were noted still leaves every payload coming back."""
    rng = random.Random(2)
    hashes = [rng.getrandbits(64) | 1 << 63 for _ in range(20_000)]
    first = [
        msgspec.msgpack.encode([1.0, [{"h": hashes[k : k + 100]}]]) for k in range(0, 20_000, 100)
    ]
    (_, _, _, literals, _, _), verbatim = split([*first, *first[::-1]])
    assert verbatim == 0 and len(literals) == 8 * len(hashes)
    broken = msgspec.msgpack.encode([{"h": hashes[:50]}])[:-3]  # cut short: kept verbatim
    payloads = [*first, broken, *first[::-1]]
    columns, verbatim = split(payloads)
    assert verbatim == 1
    assert join(len(payloads), *columns) == payloads


@pytest.mark.parametrize("name", ["lab_10rps_300s.msgpack.gz", "lab_3rps_180s.msgpack.gz"])
def test_recordings_come_back_byte_for_byte_none_verbatim(name: str) -> None:
    payloads = [record.frames[-1] for record in read_capture(capture_path(name))]
    assert len(payloads) > 500
    for start in range(0, len(payloads), 1000):
        part = payloads[start : start + 1000]
        columns, verbatim = split(part)
        assert verbatim == 0
        assert join(len(part), *columns) == part
    round_trip(payloads[:2000], Dictionary(b"".join(payloads[:50])))


def test_0015_down_rewrites_format_3_chunks_in_format_2_and_up_again(store_url: str) -> None:
    log_down_and_up(store_url, "0015", 3, {FORMAT_3_MAGIC}, {FORMAT_2_MAGIC})
