"""Log chunks re-written in place: the same batches, exactly, in another format or against
another dictionary, a chunk at a time (one UPDATE: a reader sees its old bytes or its new ones,
never neither), so that a large log need not fit in memory. A migration's way down past a chunk
format takes each chunk of that format to an older one against the same dictionary; the writer
packs a stream's chunks stored before its first dictionary formed against it
(storage/log_repack.py)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import known_name_of
from kvscope.storage.log_dictionaries_sql import dictionary, open_chunk
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_known_sql import known_hashes
from kvscope.storage.row_heads import key_where, keys_starting


def rewrite_chunks(conn: sa.Connection, magic: bytes, fmt: int) -> None:
    """Every chunk whose bytes start with `magic`, re-written in format `fmt`."""
    chunks = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
    keys = list(chunks.primary_key.columns)
    # In key order: the chunks after one checkpoint, which name its hashes, come together.
    found = keys_starting(conn, chunks, "data", magic)
    for sid, epoch, first_seq in found:
        digest = conn.execute(
            sa.select(chunks.c.dictionary).where(key_where(keys, (sid, epoch, first_seq)))
        ).scalar_one()
        against = None if digest is None else dictionary(conn, sid, bytes(digest))
        rewrite_chunk(conn, chunks, (sid, epoch, first_seq), fmt, against)


def rewrite_chunk(
    conn: sa.Connection,
    chunks: sa.Table,
    key: tuple[int, int, int],
    fmt: int,
    against: Dictionary | None,
    data: bytes | None = None,
) -> bool:
    """The chunk at `key` (stream id, epoch, first seq) re-written in format `fmt` against
    `against` (None: no dictionary; it must be stored, and stay so while the chunk names it);
    False, the chunk left as it was, where its batches would not fit one chunk again (or it is
    gone). `data`: its bytes, read with its key (else read here: a round trip)."""
    where = key_where(list(chunks.primary_key.columns), key)
    if data is None:
        data = conn.execute(sa.select(chunks.c.data).where(where)).scalar_one_or_none()
    if data is None:
        return False  # retention took it meanwhile (PostgreSQL: between two statements)
    values = repacked(conn, key, fmt, against, bytes(data))
    if values is None:
        return False
    if "known_seq" not in chunks.c:  # a migration's way down past 0020
        del values["known_seq"]
    conn.execute(sa.update(chunks).where(where).values(values))
    return True


def repacked(
    conn: sa.Connection,
    key: tuple[int, int, int],
    fmt: int,
    against: Dictionary | None,
    data: bytes,
) -> dict[str, Any] | None:
    """The chunk at `key` whose bytes are `data`, packed in format `fmt` against `against`:
    the columns that change (storage/bulk_sql.py's `REPACKED_COLUMNS`), or None where its
    batches would not fit one chunk again. Read-only: the caller writes them (one chunk's
    UPDATE, or a step's chunks in one)."""
    sid = key[0]
    chunk = open_chunk(conn, sid, data)
    # The stream's id stands for the stream: `pack` only groups rows and finds the dictionary
    # by it.
    rows: list[Any] = [(sid, key[1], *chunk.batch(i)) for i in range(len(chunk))]
    # A chunk packed against its checkpoint's hashes (format 6) stays so in format 6.
    named = known_name_of(data)
    known = {} if named is None else {sid: known_hashes(conn, sid, named)}
    again = pack(rows, fmt, {} if against is None else {sid: against}, known)
    if len(again) != 1:
        return None
    return {
        "data": again[0].data,
        "raw_bytes": again[0].raw_bytes,
        "dictionary": again[0].dictionary,
        "known_seq": again[0].known_seq,
    }
