"""The last batches applied, to tell a batch received twice from a publisher that restarted.

A repeat is the same seq with the same bytes. Holding the bytes of every recent batch would let
a publisher pin `RECENT_BATCHES` x the message limit (16 GiB at 64 MiB); a large payload is kept
as a digest instead, so the window costs at most `RECENT_BATCHES` x `KEPT_BYTES`. Nearly every
real batch is far below that, and is compared as it is, with no hashing on the hot path.
"""

from __future__ import annotations

from collections import deque
from hashlib import blake2b

RECENT_BATCHES = 256
KEPT_BYTES = 64 * 1024
"""Payloads up to this size are kept whole; larger ones as a 16-byte BLAKE2b digest."""


def kept(payload: bytes) -> bytes:
    """What the window keeps of a payload: itself, or if large its digest."""
    return payload if len(payload) <= KEPT_BYTES else blake2b(payload, digest_size=16).digest()


class RecentBatches:
    def __init__(self, size: int = RECENT_BATCHES) -> None:
        self.batches: deque[tuple[int, int, bytes]] = deque(maxlen=size)
        """(seq, payload size, `kept(payload)`): the size tells which. The live ingest appends
        to it itself (`add` without its call: once per batch)."""

    def add(self, seq: int, payload: bytes) -> None:
        self.batches.append((seq, len(payload), kept(payload)))

    def holds(self, seq: int, payload: bytes) -> bool:
        """Whether `payload` is a batch applied as `seq`, byte for byte."""
        size = len(payload)
        candidates = [k for s, n, k in self.batches if s == seq and n == size]
        return bool(candidates) and kept(payload) in candidates

    def clear(self) -> None:
        self.batches.clear()

    def kept_bytes(self) -> int:
        return sum(len(k) for _, _, k in self.batches)
