"""Format 6 of the log's chunks: hash literals found among a checkpoint's hashes, by position.

A removal names a block stored long before (a cache's whole turnover, on a full replica): its
hash is a literal in another chunk, 8 bytes that do not compress, and about half of a long
stream's literals are such. The block is in the checkpoint the chunk follows, though: a chunk
of format 6 names that checkpoint (its epoch, seq and the digest of its hashes) and stores
each literal found among the checkpoint's hashes as its position there
(storage/_log_known.pyx). The positions are in the checkpoint's hashes sorted, which the writer
and every reader make alike from the map (however its tables lay them out), and a reader checks
the digest: a chunk never decodes against other hashes than it was packed with.

The writer names a checkpoint only once its transaction committed, of the chunk's epoch and
before the chunk's first batch, and cuts chunks at its checkpoints: a chunk after a checkpoint
names that one or none, so the checkpoint a rebuild restores is the one its chunks name, and
retention, which keeps the newest checkpoint before its cutoff and all after it with the log
after it, keeps every checkpoint a kept chunk names.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from kvscope.storage._hash_sort import sorted_hashes
from kvscope.storage._log_known import KnownHashes
from kvscope.storage.log_columns import known_named


class ChunkError(ValueError):
    """Bytes that are not a log chunk this version can read."""


NAME_BYTES = 24
"""Epoch, seq (signed big-endian 8 bytes each) and the hashes' digest (8 bytes)."""


class Known(NamedTuple):
    """A checkpoint's hashes, as a chunk of format 6 names them."""

    epoch: int
    seq: int
    hashes: KnownHashes

    @property
    def name(self) -> bytes:
        return known_name(self.epoch, self.seq, self.hashes)


def digest_of(hashes: KnownHashes) -> bytes:
    return hashes.digest


def known_name(epoch: int, seq: int, hashes: KnownHashes) -> bytes:
    return (
        epoch.to_bytes(8, "big", signed=True)
        + seq.to_bytes(8, "big", signed=True)
        + digest_of(hashes)
    )


def parse_name(name: bytes) -> tuple[int, int, bytes]:
    """(epoch, seq, digest) of a name; ValueError if it is not one."""
    if len(name) != NAME_BYTES:
        raise ValueError("log chunk: not a checkpoint's name")
    return (
        int.from_bytes(name[:8], "big", signed=True),
        int.from_bytes(name[8:16], "big", signed=True),
        bytes(name[16:]),
    )


def hashes_of(arrays: Iterable[bytes | memoryview | array[int]]) -> KnownHashes:
    """The known hashes of a map whose tables hold these hash arrays (native uint64)."""
    return KnownHashes(sorted_hashes(list(arrays)))


def known_name_of(data: bytes) -> tuple[int, int, bytes] | None:
    """(epoch, seq, digest) of the checkpoint whose hashes a chunk of format 6 names; None for
    a chunk of another format. ChunkError if the name is damaged."""
    try:
        name = known_named(data)
        return None if name is None else parse_name(name)
    except ValueError as exc:
        raise ChunkError(f"not a log chunk: {exc}") from exc


def checked_hashes(data: bytes, known: Known | None) -> KnownHashes:
    """The hashes a format 6 chunk was packed against, checked against its name."""
    named = known_name_of(data)
    if named is None or known is None:
        raise ChunkError("log chunk of format 6 needs its checkpoint's hashes, not given")
    epoch, seq, digest = named
    if (known.epoch, known.seq) != (epoch, seq) or digest_of(known.hashes) != digest:
        raise ChunkError(
            f"log chunk names the hashes of checkpoint {epoch}/{seq} ({digest.hex()}), "
            f"given those of {known.epoch}/{known.seq}"
        )
    return known.hashes


def known_before(
    fmt: int, known: Mapping[Any, Known] | None, stream: Any, epoch: int, first_seq: int
) -> Known | None:
    """The known hashes a chunk of `stream` from `first_seq` is packed against, if any."""
    if fmt < 6 or not known:
        return None
    found = known.get(stream)
    if found is None or found.epoch != epoch or found.seq >= first_seq:
        return None
    return found
