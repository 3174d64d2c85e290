"""A stream's log dictionary as the known token blocks of its checkpoints (snapshot format 5).

A checkpoint's token blocks are mostly among its stream's recent content, which the log's
current dictionary holds (storage/log_dictionary.py): a checkpoint numbers those instead of
holding them, and names the dictionary by its digest. The dictionary's content is runs of
`GRANULE` token ids as msgpack ints; a snapshot takes blocks as uint32 records, so they are
read out (storage/_content_ids.pyx) once per dictionary (kept by digest: the writer encodes
many checkpoints against one, a rebuild reads one or two).
"""

from __future__ import annotations

from sqlalchemy import Connection

from kvscope.collector.snapshot import BlocksNamed, KnownBlocks, known_blocks
from kvscope.storage._content_ids import content_ids
from kvscope.storage.bounded_cache import BoundedCache
from kvscope.storage.log_dictionaries_sql import dictionary
from kvscope.storage.log_dictionary import GRANULE, Dictionary

_TOKEN_ITEM = 4
_kept: BoundedCache[bytes, KnownBlocks] = BoundedCache(4)


def known_of(found: Dictionary) -> KnownBlocks:
    """The dictionary's granules as known blocks of `GRANULE` tokens, under its digest."""
    known = _kept.get(found.digest)
    if known is not None:
        return known
    records = content_ids(found.content, GRANULE)
    known = known_blocks(found.digest, records.tobytes(), GRANULE * _TOKEN_ITEM)
    return _kept.put(found.digest, known)


def stored_blocks(conn: Connection, sid: int) -> BlocksNamed:
    """The known blocks a checkpoint of stream `sid` names, read from the store (ChunkError if
    it lacks them)."""
    return lambda digest: known_of(dictionary(conn, sid, digest))
