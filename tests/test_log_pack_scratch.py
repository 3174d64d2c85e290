"""The writer packs a transaction's log chunks in one call (storage/_log_columns.pyx's
`pack_runs`), and each chunk's scratch (its hash table) goes as soon as its columns are made:
held for all of them until the call ends, a transaction of many chunks held their sum, a peak
of memory the store's writer had no use for (benchmarks/pack_rss.py). Counted, not measured;
and the chunks packed together are the bytes each packs alone."""

from __future__ import annotations

import random

from kvscope.storage._log_columns import pack_runs, scratch_most, split
from kvscope.storage.log_columns import NO_GRANULES
from tests.test_log_dictionary import block_log, token_pool

CHUNKS = 24


def chunk_payloads(rng: random.Random) -> list[list[bytes]]:
    """Chunks of batches whose blocks recur (hash references and token runs within a chunk),
    of differing lengths, one of them empty."""
    pool = token_pool(rng, 60)
    return [[row[5] for row in block_log(rng, rng.randrange(0, 90), pool)] for _ in range(CHUNKS)]


def test_a_chunk_s_scratch_goes_before_the_next_chunk_is_packed() -> None:
    runs = chunk_payloads(random.Random(3))
    pack_runs(runs, [NO_GRANULES] * CHUNKS, [True] * CHUNKS)
    assert scratch_most() == 1


def test_chunks_packed_together_are_the_bytes_each_packs_alone() -> None:
    rng = random.Random(8)
    runs = chunk_payloads(rng)
    # Each way a chunk is packed: format 3 (no index), 4 (an index, no planes), 5 (planes).
    indexes = [None if i % 3 == 0 else NO_GRANULES for i in range(CHUNKS)]
    planes = [i % 3 == 2 for i in range(CHUNKS)]
    together = pack_runs(runs, indexes, planes)
    alone = [
        pack_runs([run], [index], [plane])[0]
        for run, index, plane in zip(runs, indexes, planes, strict=True)
    ]
    assert together == alone
    for run, index, (parts, kept) in zip(runs, indexes, together, strict=True):
        columns, kept_alone = split(run, granules=index)
        assert kept == kept_alone == 0
        assert parts[:5] == list(columns[:5])  # the planes, where made, take the tokens' place
