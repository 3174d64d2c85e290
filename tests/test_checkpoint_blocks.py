"""A log dictionary's content read as the known blocks of checkpoints: the very token ids its
runs hold, in whole runs."""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.storage._content_ids import content_ids
from kvscope.storage.checkpoint_blocks import known_of
from kvscope.storage.log_dictionary import GRANULE, Dictionary, StreamContent


@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(1, 5))
def test_content_ids_are_the_msgpack_ints_in_whole_runs(ids: list[int], granule: int) -> None:
    content = b"".join(msgspec.msgpack.encode(i) for i in ids)
    whole = len(ids) - len(ids) % granule
    assert content_ids(content, granule) == array("I", ids[:whole])
    # What is not an id of 32 bits ends the content read.
    assert content_ids(content + msgspec.msgpack.encode(2**32) + content, granule) == array(
        "I", ids[:whole]
    )


def test_a_stream_dictionary_is_known_as_its_runs() -> None:
    rng = random.Random(5)
    tokens = [[rng.randrange(200_000) for _ in range(GRANULE)] for _ in range(300)]
    payloads = [msgspec.msgpack.encode([1.0, [[t]]]) for t in tokens]
    content = StreamContent()
    content.see(payloads)
    dictionary = Dictionary(b"".join(content.runs()))
    known = known_of(dictionary)
    assert known.name == dictionary.digest and known.record == 4 * GRANULE
    assert known.records == b"".join(array("I", t).tobytes() for t in tokens)
    assert known_of(dictionary) is known  # kept by digest


def test_no_granule_is_refused() -> None:
    with pytest.raises(ValueError):
        content_ids(b"\x01", 0)
