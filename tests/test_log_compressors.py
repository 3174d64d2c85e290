"""Format 2's compressors are made once per dictionary and thread, not once per transaction,
and the chunks they make are byte for byte those of fresh ones."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import zstandard

from kvscope.storage import log_compress
from kvscope.storage.log_chunks import pack
from kvscope.storage.log_dictionary import Dictionary
from tests.test_log_dictionary import A, B, block_log, runs_of, token_pool


def test_each_dictionarys_compressor_is_made_once_and_packs_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(7)
    pool = token_pool(rng)
    rows = block_log(rng, 200, pool) + block_log(rng, 30, pool, B)
    content = b"".join(run for block in pool for run in runs_of(block))
    fresh = pack(rows, 2, {A: Dictionary(content)})  # made with compressors of their own
    made: list[Any] = []
    real = zstandard.ZstdCompressor

    def counted(*args: Any, **kwargs: Any) -> zstandard.ZstdCompressor:
        made.append(kwargs.get("dict_data"))
        return real(*args, **kwargs)

    monkeypatch.setattr(zstandard, "ZstdCompressor", counted)
    monkeypatch.setattr(log_compress, "_plain", threading.local())
    dictionary = Dictionary(content)
    for _ in range(3):  # three transactions: A's dictionary and B's none, each made once
        assert pack(rows, 2, {A: dictionary}) == fresh
    assert len(made) == 2 and made.count(None) == 1

    other: list[zstandard.ZstdCompressor] = []
    thread = threading.Thread(target=lambda: other.append(dictionary.compressor(3)))
    thread.start()
    thread.join()
    assert other[0] is not dictionary.compressor(3)  # another thread's: never shared
