"""A stream's log dictionary as the known token blocks of its checkpoints (snapshot format 5).

A checkpoint's token blocks are mostly among its stream's recent content, which the log's
current dictionary holds (storage/log_dictionary.py): a checkpoint numbers those instead of
holding them, and names the dictionary by its digest. The dictionary's content is runs of
`GRANULE` token ids as msgpack ints; a snapshot takes blocks as uint32 records, so they are
read out (storage/_content_ids.pyx): kept by digest for readers (a rebuild reads one or two
dictionaries, many times), read out again for each checkpoint the writer encodes (one in many
batches: a copy kept would double its current dictionary's content for the whole run).
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
    return _kept.put(found.digest, read_known(found))


def read_known(found: Dictionary) -> KnownBlocks:
    """`known_of`'s blocks read out again, not kept."""
    records = content_ids(found.content, GRANULE)
    return known_blocks(found.digest, records.tobytes(), GRANULE * _TOKEN_ITEM)


def stored_blocks(conn: Connection, sid: int) -> BlocksNamed:
    """The known blocks a checkpoint of stream `sid` names, read from the store (ChunkError if
    it lacks them)."""
    return lambda digest: known_of(dictionary(conn, sid, digest))
