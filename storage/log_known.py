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

import hashlib
from array import array
from collections.abc import Iterable
from typing import NamedTuple

from kvscope.storage._log_known import KnownHashes, sorted_hashes

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
    return hashlib.blake2b(hashes.values, digest_size=8).digest()


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
