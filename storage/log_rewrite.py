"""A migration's way down past a log chunk format: each chunk of that format re-written in an
older one against the same dictionary (the same batches, exactly), one at a time so that a
large log need not fit in memory."""

from __future__ import annotations

import sqlalchemy as sa

from kvscope.storage.log_chunks import pack
from kvscope.storage.log_dictionaries_sql import dictionary, open_chunk


def rewrite_chunks(conn: sa.Connection, magic: bytes, fmt: int) -> None:
    """Every chunk whose bytes start with `magic`, re-written in format `fmt`."""
    chunks = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
    keys = (chunks.c.stream_id, chunks.c.epoch, chunks.c.first_seq)
    found = conn.execute(sa.select(*keys).where(sa.func.substr(chunks.c.data, 1, 4) == magic))
    for sid, epoch, first_seq in found.all():
        where = sa.and_(*(c == v for c, v in zip(keys, (sid, epoch, first_seq), strict=True)))
        data, digest = conn.execute(
            sa.select(chunks.c.data, chunks.c.dictionary).where(where)
        ).one()
        chunk = open_chunk(conn, sid, bytes(data))
        named = {} if digest is None else {sid: dictionary(conn, sid, bytes(digest))}
        rows = [(sid, epoch, *chunk.batch(i)) for i in range(len(chunk))]
        (again,) = pack(rows, fmt, named)  # one run: it was one chunk
        conn.execute(
            sa.update(chunks).where(where).values(data=again.data, raw_bytes=again.raw_bytes)
        )
