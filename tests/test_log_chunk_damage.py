"""A damaged log chunk whose zstd frame says it holds far more than any chunk does: unreadable
(`ChunkError`, counted and reported where it is read), never a MemoryError nor an allocation
of what the damaged header says."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
import sqlalchemy as sa
import zstandard

from kvscope.storage import log_columns, log_dictionaries_sql, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import NotInStore, Position, position_at_seq, rebuild, stream_id
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk, ChunkError
from tests.migration_support import write
from tests.test_log_dictionary import A, block_log, token_pool
from tests.test_log_dictionary_store import row_writer

HUGE = 1 << 50


def huge_frame(says: int = HUGE) -> bytes:
    """A zstd frame whose header says it holds `says` bytes: one raw byte follows."""
    single_segment_with_8_byte_size = 0xE0
    last_raw_block_of_1_byte = bytes([1 | 1 << 3, 0, 0])
    return (
        b"\x28\xb5\x2f\xfd"
        + bytes([single_segment_with_8_byte_size])
        + struct.pack("<Q", says)
        + last_raw_block_of_1_byte
        + b"x"
    )


def test_a_format_1_chunk_saying_a_huge_size_is_unreadable() -> None:
    with pytest.raises(ChunkError):
        Chunk(huge_frame())


@pytest.mark.parametrize("fmt", [3, 4, 5])
def test_a_columnar_chunk_with_a_frame_saying_a_huge_size_is_unreadable(fmt: int) -> None:
    rows = block_log(random.Random(2), 30, token_pool(random.Random(2), 10))
    opened = Chunk(pack(rows, fmt)[0].data)
    granules = None if fmt == 3 else log_columns.NO_GRANULES
    frames, _ = log_columns.columns(
        opened.seqs, opened.ts, opened.recv_ts, opened.payloads, granules, planes=fmt == 5
    )
    assert len(frames) == log_columns.FRAMES[f"KVL{fmt}".encode()]
    for damaged in range(len(frames)):
        compressed = [zstandard.ZstdCompressor().compress(f) for f in frames]
        assert len(Chunk(log_columns.assemble(b"", len(rows), compressed))) == len(rows)
        compressed[damaged] = huge_frame()
        with pytest.raises(ChunkError):
            Chunk(log_columns.assemble(b"", len(rows), compressed))


def test_a_frame_within_bounds_is_read_as_before() -> None:
    rows = block_log(random.Random(3), 30, token_pool(random.Random(3), 10))
    for fmt in (1, 2, 3, 4, 5):
        (chunk,) = pack(rows, fmt)
        assert list(Chunk(chunk.data).payloads) == [r[5] for r in rows]


def test_a_rebuild_past_a_deleted_dictionary_says_the_map_is_unknown(tmp_path: Path) -> None:
    engine = open_store(f"sqlite:///{tmp_path}/k.sqlite")
    rows = block_log(random.Random(4), 600, token_pool(random.Random(4), 40))
    writer = row_writer()
    for start in range(0, len(rows), 10):
        write(engine, writer, rows[start : start + 10])
    with engine.begin() as conn:
        assert conn.execute(sa.delete(schema.log_dictionaries)).rowcount
    log_dictionaries_sql._kept.clear()  # as a process started since would find it
    with engine.connect() as conn:
        sid = stream_id(conn, A.replica)
        with pytest.raises(NotInStore, match="not in the store"):
            rebuild(conn, position_at_seq(conn, sid, len(rows) - 1), A)
        with pytest.raises(NotInStore, match="not in the store"):
            rebuild(conn, Position(sid, 0, len(rows) - 1, rows[-1][3]), A)
    engine.dispose()
