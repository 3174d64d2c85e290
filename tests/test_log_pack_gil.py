"""The writer packs a transaction's log chunks letting go of the GIL once for all their walks
(the split, its check that the columns give the payloads back, the token planes), not once
per walk of each chunk: taking the GIL back from a busy ingest thread can cost a whole switch
interval, and under load the holder's own wait for a CPU. Counted, not timed."""

from __future__ import annotations

import random

import pytest

from kvscope.storage._log_columns import pack_runs, walks_let_go
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_dictionary import Dictionary
from tests.test_log_dictionary import A, B, block_log, runs_of, token_pool


def test_a_transaction_s_chunks_let_go_of_the_gil_once() -> None:
    rng = random.Random(5)
    pool = token_pool(rng, 100)
    rows = block_log(rng, 2500, pool) + block_log(rng, 1200, pool, B)
    dictionary = Dictionary(b"".join(run for block in pool for run in runs_of(block)))
    before = walks_let_go()
    chunks = pack(rows, 5, {A: dictionary})
    assert len(chunks) >= 4 and {chunk.stream for chunk in chunks} == {A, B}
    assert walks_let_go() - before == 1


def test_runs_without_an_index_and_a_plane_flag_each_are_refused() -> None:
    # The walks index the three lists without bounds checks: short ones must not be read past.
    payloads = [b"\x90", b"\x90"]
    with pytest.raises(ValueError, match="runs"):
        pack_runs([payloads, payloads], [None], [False, False])
    with pytest.raises(ValueError, match="runs"):
        pack_runs([payloads], [None], [])
