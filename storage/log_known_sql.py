"""The checkpoint hashes a stored log chunk of format 6 names (storage/log_known.py), read from
the store: the checkpoint's map decoded, its hashes sorted. Kept by name (its digest included,
so the same hashes wherever read) for the next chunks: a rebuild or a reader of the log reads
many chunks after one checkpoint. A rebuild, which has just decoded the checkpoint its chunks
name, offers its map (`offered`): its hashes are taken from there, not decoded again, where
their digest is the one named (else, the map changed meanwhile, from the store)."""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, select

from kvscope.collector.snapshot import SnapshotError, decode_tables
from kvscope.collector.snapshot_delta import decode_delta
from kvscope.storage import schema
from kvscope.storage.bounded_cache import BoundedCache
from kvscope.storage.checkpoint_blocks import stored_blocks
from kvscope.storage.log_chunks import ChunkError
from kvscope.storage.log_known import Known, digest_of, hashes_of
from kvscope.storage.not_in_store import NotInStore


class CheckpointUnreadable(ChunkError, NotInStore):
    """The checkpoint a format 6 chunk names, gone, damaged or not the one named: the chunk
    cannot be read, and a map rebuilt through it is unknown (NotInStore), as past a lost
    dictionary (storage/log_dictionaries_sql.py)."""


_kept: BoundedCache[tuple[int, int, int, bytes], Known] = BoundedCache(4)
_offered: dict[tuple[int, int, int], list[Any]] = {}
_lock = threading.Lock()


@contextmanager
def offered(sid: int, epoch: int, seq: int, tables: Mapping[Any, Any]) -> Iterator[None]:
    """While in the block, a chunk naming checkpoint (epoch, seq) of stream `sid` may take its
    hashes from `tables` (the checkpoint's map, decoded: block tables), copied now (cheap: the
    replay changes the tables) and sorted only if a chunk asks."""
    key = (sid, epoch, seq)
    arrays = [table.hash_array() for table in tables.values()]
    with _lock:
        _offered[key] = arrays
    try:
        yield
    finally:
        with _lock:
            if _offered.get(key) is arrays:
                del _offered[key]


def known_hashes(conn: Connection, sid: int, named: tuple[int, int, bytes]) -> Known:
    """The hashes of checkpoint (epoch, seq) of stream `sid` (CheckpointUnreadable if it is not
    stored as named: the chunk naming it cannot be read, rather than read wrong)."""
    epoch, seq, digest = named
    key = (sid, epoch, seq, digest)
    found = _kept.get(key)
    if found is not None:
        return found
    with _lock:
        arrays = _offered.get((sid, epoch, seq))
    if arrays is not None:
        found = Known(epoch, seq, hashes_of(arrays))
        if digest_of(found.hashes) == digest:
            return _kept.put(key, found)
    c = schema.checkpoints
    row = conn.execute(
        select(c.c.snapshot, c.c.key_seq).where(
            c.c.stream_id == sid, c.c.epoch == epoch, c.c.seq == seq
        )
    ).first()
    what = f"log chunk names checkpoint {epoch}/{seq} of stream {sid}"
    if row is None:
        raise CheckpointUnreadable(f"{what}: not stored")
    try:
        found = Known(epoch, seq, hashes_of(_hash_arrays(conn, sid, epoch, row)))
    except SnapshotError as exc:
        raise CheckpointUnreadable(f"{what}: {exc}") from exc
    if digest_of(found.hashes) != digest:
        raise CheckpointUnreadable(f"{what}: the one stored holds other hashes")
    return _kept.put(key, found)


def _hash_arrays(conn: Connection, sid: int, epoch: int, row: Any) -> list[array[int]]:
    if row.key_seq is None:
        tables, _ = decode_tables(bytes(row.snapshot), stored_blocks(conn, sid))
    else:
        c = schema.checkpoints
        key = conn.execute(
            select(c.c.snapshot).where(
                c.c.stream_id == sid, c.c.epoch == epoch, c.c.seq == row.key_seq
            )
        ).scalar_one_or_none()
        if key is None:
            raise CheckpointUnreadable(
                f"log chunk names a delta checkpoint of stream {sid} without its key"
            )
        tables, _ = decode_delta(bytes(row.snapshot), bytes(key))
    return [table.hash_array() for table in tables.values()]
