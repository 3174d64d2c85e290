"""Log chunks are packed to the same bytes whatever the packing's memory does: with the columns
written into no rooms (grown from their first bytes, as before rooms were sized ahead:
storage/_log_rooms.pxd), rooms learned, or rooms of the most the split can put there, for
streams of block batches, hostile payloads and many chunks at once, in each format."""

from __future__ import annotations

import hashlib
import random
from array import array

import msgspec
import pytest

from kvscope.storage._log_columns import rooms_outgrown, set_room_shares
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_known import Known, hashes_of
from kvscope.storage.rows import LogRow
from tests.test_log_dictionary import A, B, block_log, runs_of, token_pool


def _hostile(rng: random.Random, n: int) -> list[bytes]:
    """Payloads the split cannot read whole (kept verbatim), or reads in odd ways: random
    bytes, msgpack cut short, floats and 8-byte ints alone, empty, and one large batch."""
    out: list[bytes] = []
    for i in range(n):
        kind = i % 6
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(0, 300)))
        elif kind == 1:
            body = msgspec.msgpack.encode([rng.random(), [rng.getrandbits(64)] * 5, "x" * 40])
            out.append(body[: rng.randrange(1, len(body))])
        elif kind == 2:
            out.append(msgspec.msgpack.encode([rng.random() for _ in range(rng.randrange(40))]))
        elif kind == 3:
            out.append(msgspec.msgpack.encode([rng.getrandbits(64) for _ in range(30)] * 3))
        elif kind == 4:
            out.append(b"")
        else:
            ids = [rng.randrange(1 << 17) for _ in range(rng.randrange(1, 40_000))]
            out.append(msgspec.msgpack.encode([[ids, ids[:16]], rng.getrandbits(64)]))
    return out


def _streams() -> dict[str, tuple[list[LogRow], dict[object, Dictionary], dict[object, Known]]]:
    rng = random.Random(20)
    pool = token_pool(rng, 120)
    dictionary = Dictionary(b"".join(run for block in pool[:60] for run in runs_of(block)))
    blocks = block_log(rng, 700, pool) + block_log(rng, 90, pool, B)
    hostile = [
        (A, 0, i, 1000.0 + i / 50, 1000.0 + i / 49, p) for i, p in enumerate(_hostile(rng, 60))
    ]
    many = block_log(rng, 4_500, pool)  # more than one chunk's batches: chunks at once
    hashes = [rng.getrandbits(64) for _ in range(2_000)]
    removed = [
        (A, 0, 100 + k, 1000.0 + k, 1000.0 + k, msgspec.msgpack.encode([1.0, hashes[k : k + 9]]))
        for k in range(0, 2_000, 7)
    ]
    known: dict[object, Known] = {A: Known(0, 50, hashes_of([array("Q", hashes[::2])]))}
    return {
        "blocks": (blocks, {A: dictionary}, {}),
        "blocks-plain": (blocks, {}, {}),
        "hostile": (hostile, {A: dictionary}, {}),
        "hostile-plain": (hostile, {}, {}),
        "many": (many, {A: dictionary}, {}),
        "many-plain": (many, {}, {}),
        "known": (removed, {}, known),
    }


STREAMS = _streams()
SHARES = {"none": [0] * 7, "learned": None, "whole": [1 << 20] * 7}
"""Rooms for the columns: none (each grows from its first bytes, as before rooms), learned
from the chunks packed last, and as large as the split can fill (capped at its bound)."""


def _digest(
    rows: list[LogRow], fmt: int, dictionaries: dict[object, Dictionary], known: dict[object, Known]
) -> str:
    digest = hashlib.sha256()
    for chunk in pack(rows, fmt, dictionaries, known):
        digest.update(repr(chunk._replace(data=b"", stream=str(chunk.stream))).encode())
        digest.update(len(chunk.data).to_bytes(8, "little") + chunk.data)
    return digest.hexdigest()


@pytest.mark.parametrize("fmt", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_chunks_are_the_same_bytes_whatever_their_rooms(name: str, fmt: int) -> None:
    # Compared within the run, not with digests recorded once: zstd's output may change with
    # the library's version.
    rows, dictionaries, known = STREAMS[name]
    digests = set()
    for kind, shares in SHARES.items():
        _digest(rows, fmt, dictionaries, known)  # rooms learned from this stream
        if shares is not None:
            set_room_shares(shares)
        outgrown = rooms_outgrown()
        digests.add(_digest(rows, fmt, dictionaries, known))
        if kind == "none" and fmt >= 3 and name != "known":  # (its one chunk is small)
            assert rooms_outgrown() > outgrown  # the columns grew: the path before rooms
    assert len(digests) == 1
