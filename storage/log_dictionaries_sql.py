"""The log's dictionaries in the store: written beside the chunks that name them, read (and kept
a while, by digest) to open those chunks, deleted when no chunk names them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sqlalchemy import Connection, and_, delete, exists, func, or_, select
from sqlalchemy.dialects import postgresql

from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.bounded_cache import BoundedCache
from kvscope.storage.bulk_sql import upsert_released
from kvscope.storage.log_chunks import Chunk, ChunkError, known_name_of, named_dictionary
from kvscope.storage.log_dictionary import Dictionary, DictionaryRow, from_stored
from kvscope.storage.not_in_store import NotInStore

_t = schema.log_dictionaries
_kept: BoundedCache[bytes, Dictionary] = BoundedCache(8)
"""Dictionaries kept in memory for reading: a rebuild reads one stream's, mostly one."""


def insert_dictionaries(
    conn: Connection, rows: list[DictionaryRow], stream_id: Callable[[StreamId], int]
) -> None:
    """A dictionary already there (a retried transaction, or the same content made again) is
    marked made now: retention keeps each stream's newest."""
    if conn.dialect.name == "sqlite":  # the dictionary's copy not kept by SQLite after
        for row in rows:
            values = {
                "stream_id": stream_id(row.stream),
                "digest": row.digest,
                "made_at": row.made_at,
                "raw_bytes": row.raw_bytes,
                "data": row.data,
            }
            upsert_released(conn, _t, ("stream_id", "digest"), values, updated=("made_at",))
        return
    for row in rows:
        statement = postgresql.insert(_t).values(
            stream_id=stream_id(row.stream),
            digest=row.digest,
            made_at=row.made_at,
            raw_bytes=row.raw_bytes,
            data=row.data,
        )
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=["stream_id", "digest"], set_={"made_at": row.made_at}
            )
        )


class DictionaryUnreadable(ChunkError, NotInStore):
    """A dictionary the log names, gone or damaged: the log packed against it cannot be read,
    and a map rebuilt through it is unknown (NotInStore), as past any other unreadable log."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what} is {why}: the log packed against it cannot be read")


def dictionary(conn: Connection, sid: int, digest: bytes) -> Dictionary:
    """The stream's dictionary `digest`; DictionaryUnreadable if the store lacks it."""
    found = _kept.get(digest)
    if found is not None:
        return found
    data = conn.execute(
        select(_t.c.data).where(_t.c.stream_id == sid, _t.c.digest == digest)
    ).scalar_one_or_none()
    if data is None:
        raise DictionaryUnreadable(
            f"log dictionary {digest.hex()} of stream {sid}", "not in the store"
        )
    found = from_stored(bytes(data))
    if found.digest != digest:
        raise DictionaryUnreadable(f"log dictionary {digest.hex()} of stream {sid}", "damaged")
    return _kept.put(digest, found)  # by digest: the same content wherever it was read


def open_chunk(conn: Connection, sid: int, data: bytes) -> Chunk:
    """A stored chunk of stream `sid`, with the dictionary and checkpoint hashes it names."""
    digest = named_dictionary(data)
    known = None
    named = known_name_of(data)
    if named is not None:
        # Not at the top: an import cycle (log_known_sql -> checkpoint_blocks -> `dictionary`).
        from kvscope.storage.log_known_sql import known_hashes

        # Read when the payloads are first asked for: a reader of stamps alone needs none.
        known = partial(known_hashes, conn, sid, named)
    return Chunk(data, None if digest is None else dictionary(conn, sid, digest), known)


def prune_dictionaries(conn: Connection) -> int:
    """Delete the dictionaries no chunk or checkpoint names, but each stream's newest (its
    writer may name it in chunks to come, trusting it stored); how many went."""
    c, k, newer = schema.log_chunks, schema.checkpoints, _t.alias("newer")
    named = or_(
        exists().where(c.c.stream_id == _t.c.stream_id, c.c.dictionary == _t.c.digest),
        exists().where(k.c.stream_id == _t.c.stream_id, k.c.dictionary == _t.c.digest),
    )
    newest = (
        select(func.max(newer.c.made_at)).where(newer.c.stream_id == _t.c.stream_id)
    ).scalar_subquery()
    result = conn.execute(delete(_t).where(and_(~named, _t.c.made_at < newest)))
    return int(result.rowcount or 0)
