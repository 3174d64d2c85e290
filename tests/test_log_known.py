"""Log chunk format 6 (storage/log_known.py): hash literals found among a checkpoint's hashes
are stored as their position there, and every payload still comes back byte for byte."""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk, ChunkError, known_name_of
from kvscope.storage.log_columns import FORMAT_5_MAGIC, FORMAT_6_MAGIC
from kvscope.storage.log_known import Known, hashes_of
from kvscope.storage.rows import LogRow
from tests.test_log_columns import ANY_MSGPACK
from tests.test_log_dictionary import A

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rows_of(payloads: list[bytes], first_seq: int = 100, epoch: int = 0) -> list[LogRow]:
    return [
        (A, epoch, first_seq + i, 1000.0 + i / 1000, 1003.0 + i / 999, p)
        for i, p in enumerate(payloads)
    ]


def removals(hashes: list[int]) -> list[bytes]:
    return [
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": hashes[k : k + 4]}]])
        for k in range(0, len(hashes), 4)
    ]


def known_of(hashes: list[int], epoch: int = 0, seq: int = 50) -> Known:
    return Known(epoch, seq, hashes_of([array("Q", hashes)]))


def batches(chunk: Chunk) -> list[tuple[object, ...]]:
    return [tuple(chunk.batch(i)) for i in range(len(chunk))]


def test_removals_of_a_checkpoints_blocks_are_stored_as_positions() -> None:
    rng = random.Random(3)
    cached = [rng.getrandbits(64) for _ in range(5_000)]
    removed = rng.sample(cached, 2_000) + [rng.getrandbits(64) for _ in range(40)]
    rows = rows_of(removals(removed))
    known = known_of(cached)
    (plain,) = pack(rows, 5)
    (chunk,) = pack(rows, 6, known={A: known})
    assert chunk.data.startswith(FORMAT_6_MAGIC) and plain.data.startswith(FORMAT_5_MAGIC)
    assert known_name_of(chunk.data) == (0, 50, known.name[16:])
    # 2,000 literals of 8 bytes become positions of about 2 bytes.
    assert len(chunk.data) < len(plain.data) - 2_000 * 5
    assert batches(Chunk(chunk.data, known=known)) == [tuple(r[2:]) for r in rows]


def test_a_format_6_chunk_is_never_read_against_other_hashes() -> None:
    rng = random.Random(4)
    cached = [rng.getrandbits(64) for _ in range(100)]
    known = known_of(cached)
    (chunk,) = pack(rows_of(removals(cached[:40])), 6, known={A: known})
    with pytest.raises(ChunkError, match="needs its checkpoint's hashes"):
        Chunk(chunk.data)
    others = [
        known_of(cached[1:]),  # other hashes under the same checkpoint's seq
        known_of(cached, seq=51),
        known_of(cached, epoch=1),
    ]
    for other in others:
        with pytest.raises(ChunkError, match="names the hashes of checkpoint"):
            Chunk(chunk.data, known=other)


def test_only_chunks_after_the_checkpoint_in_its_epoch_are_packed_against_it() -> None:
    rng = random.Random(5)
    cached = [rng.getrandbits(64) for _ in range(100)]
    payloads = removals(cached)
    for first_seq, epoch in ((50, 0), (10, 0), (100, 1)):
        (chunk,) = pack(rows_of(payloads, first_seq, epoch), 6, known={A: known_of(cached)})
        assert chunk.data.startswith(FORMAT_5_MAGIC), (first_seq, epoch)
    (chunk,) = pack(rows_of(payloads), 6)  # no checkpoint known: format 5's bytes
    assert chunk.data.startswith(FORMAT_5_MAGIC)


@SETTINGS
@given(
    st.lists(ANY_MSGPACK, min_size=1, max_size=30),
    st.lists(st.integers(0, 2**64 - 1), max_size=50),
    st.lists(st.integers(-(2**63), -(2**31) - 1), max_size=10),
)
def test_any_msgpack_comes_back_against_any_known_hashes(
    values: list[object], unsigned: list[int], signed: list[int]
) -> None:
    """Signed hashes (msgpack's int64) are found by their 8 bytes, as the unsigned ones."""
    hashes = unsigned + signed
    payloads = [msgspec.msgpack.encode(v) for v in values]
    payloads += [msgspec.msgpack.encode({"h": hashes})] if hashes else []
    known = Known(0, 50, hashes_of([array("Q", [h % 2**64 for h in hashes[::2]])]))
    rows = rows_of(payloads)
    chunks = pack(rows, 6, known={A: known})
    back = [b for chunk in chunks for b in batches(Chunk(chunk.data, known=known))]
    assert back == [tuple(r[2:]) for r in rows]
