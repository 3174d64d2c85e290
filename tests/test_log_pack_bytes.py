"""Log chunks are packed to the same bytes whatever the packing's memory does: digests of
chunks packed before the columns were written into rooms sized ahead (storage/_log_rooms.pxd),
for streams of block batches, hostile payloads and many chunks at once, in each format."""

from __future__ import annotations

import hashlib
import random
from array import array

import msgspec
import pytest

from kvscope.storage.log_chunks import pack
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
DIGESTS: dict[tuple[str, int], str] = {
    ("blocks", 1): "79a584cc8ad6112d6b2a5329bc6cfc097a4b2e65bf98034ed53a1efeb5a1e292",
    ("blocks", 2): "b319e47fc34814a36e41040b25641c671b3dbb6ad43c2c606e87a3ce444a6780",
    ("blocks", 3): "8e02535a638eb1cb875689a73578795f848310958e5667b83e4851a3da6485bf",
    ("blocks", 4): "c1e5253bf899e2701015536e3939d4425fd87f80127ac40a18e666454dcf2601",
    ("blocks", 5): "7f6d638bd0ff2ab3e45b82df7d6b4d316692af5833dabb8048a7b4d096e4ff41",
    ("blocks", 6): "7f6d638bd0ff2ab3e45b82df7d6b4d316692af5833dabb8048a7b4d096e4ff41",
    ("blocks-plain", 1): "79a584cc8ad6112d6b2a5329bc6cfc097a4b2e65bf98034ed53a1efeb5a1e292",
    ("blocks-plain", 2): "99a9e46b28b20a23a43db5295472b908acaa2cafa8d6d62e4158a8ca59b1210c",
    ("blocks-plain", 3): "a86b1e31cd4507fd638f65affd896703481e6e1a5e6db22cd1dff9ef3fa68770",
    ("blocks-plain", 4): "542e3d41d71fd2ec91c249d03b6bbfda6185b0d5e56ce2eec1e5ce922247bef5",
    ("blocks-plain", 5): "387f297d0ad2fd9d941d24209cb25b64054bb5ba33978b66e0fca14022b2724a",
    ("blocks-plain", 6): "387f297d0ad2fd9d941d24209cb25b64054bb5ba33978b66e0fca14022b2724a",
    ("hostile", 1): "593e4594b95e73e7e706cab4b2af2fef9e3522631ef1d8f2b01a9ec968b36ce3",
    ("hostile", 2): "4d71b8c2914cee1b91550f5b1884219fc492b8026504e22dc63e6851c21e93be",
    ("hostile", 3): "3e86739d3c303e846158a170b4869f095d59ba8a268fdaba84aefa154cfd5a6b",
    ("hostile", 4): "463a77cf0f506a711f0cbd31c05ebf0c77ba30e3b589f9a054e822075bc289fe",
    ("hostile", 5): "463a77cf0f506a711f0cbd31c05ebf0c77ba30e3b589f9a054e822075bc289fe",
    ("hostile", 6): "463a77cf0f506a711f0cbd31c05ebf0c77ba30e3b589f9a054e822075bc289fe",
    ("hostile-plain", 1): "593e4594b95e73e7e706cab4b2af2fef9e3522631ef1d8f2b01a9ec968b36ce3",
    ("hostile-plain", 2): "863384e9b0c76b236308efe934388b38bdb9a95b40878222ed5bd68fc6f4fc0a",
    ("hostile-plain", 3): "46094e9fef4bf719b902f40404aec651f4c2f0d3c4b38a86d02af415505e7b67",
    ("hostile-plain", 4): "0d3db9446a27fc252bc6b8d4ba84d15e5cafc0733291ee2f0d0f94342d5aff1b",
    ("hostile-plain", 5): "41327e7655c06a3eb603a13711339684cfe486f1291733ed1a406b61cbbc38b6",
    ("hostile-plain", 6): "41327e7655c06a3eb603a13711339684cfe486f1291733ed1a406b61cbbc38b6",
    ("known", 1): "81b722544c8b1f4c9cd134af3363f006431de5b2ff9017a92032ab83fc1d677a",
    ("known", 2): "74d99c7674e96428d1cfc1be9bbb5a6c199bd4151d71e2066b566d998285d26b",
    ("known", 3): "f2a2c47ff776a67b25973c42c8c5e241a7ad5ea8e4df4fed014781bcc68a26a0",
    ("known", 4): "eb75fe2f9b7c1dac931b20ddf6e88b023c2ff6f09142ceee16263add13b3355d",
    ("known", 5): "f08400e610bac391a629f90c2a6201f7ec0ef978c2b13ba2450250fdd78adbd4",
    ("known", 6): "27aa02ba14485228950d51f0d801fd5d93724a3359579838c5d9cb2573e8bb0f",
    ("many", 1): "7c3fe6d1490fa8a663433db60ff49e8fe72261d415c0b77dad6da2f0ffd8d1ee",
    ("many", 2): "f82afa22ae65c5796577f9819cdf51ce8cc5ddae938dac23e85ad734a99782b9",
    ("many", 3): "e5c6bfb6369119b1f56e37f24059c41aaa491188b23c8f68a9e62130c6dbd960",
    ("many", 4): "c9aee2b68f51024f5a83ef08e835fd059f022d3cc6ed4c53084e7cdba84307b0",
    ("many", 5): "c9aee2b68f51024f5a83ef08e835fd059f022d3cc6ed4c53084e7cdba84307b0",
    ("many", 6): "c9aee2b68f51024f5a83ef08e835fd059f022d3cc6ed4c53084e7cdba84307b0",
    ("many-plain", 1): "7c3fe6d1490fa8a663433db60ff49e8fe72261d415c0b77dad6da2f0ffd8d1ee",
    ("many-plain", 2): "7ea7ac96396813c07b37a5261009e5906d94172e7925048d2a1831c7ad89e3d3",
    ("many-plain", 3): "5e3cef19c97c0c1bc971fc80decb9144e17c81c4097ae961205b1aa7558e3226",
    ("many-plain", 4): "a41f651f9bc7cbe1baf9fc23d785de603db4e7d1a3c66ee6aa44a413ade58274",
    ("many-plain", 5): "0c8e77f6b7c12bc8ee15ba8caaf933ff26eccdffc331a92fe6bae388e897811f",
    ("many-plain", 6): "0c8e77f6b7c12bc8ee15ba8caaf933ff26eccdffc331a92fe6bae388e897811f",
}
"""sha256 of each stream's chunks in each format, as the packing before rooms made them."""


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
def test_chunks_are_the_bytes_packed_before_rooms(name: str, fmt: int) -> None:
    rows, dictionaries, known = STREAMS[name]
    assert _digest(rows, fmt, dictionaries, known) == DIGESTS[name, fmt]
