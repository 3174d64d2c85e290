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


def _ids_read(content: bytes, granule: int) -> array[int]:
    """What `content_ids` reads, in Python: msgpack ints >= 0 of any int format (a signed one
    too, an unsigned one wider than it needs), up to the first that is none or past 32 bits,
    cut to whole runs."""
    ids: list[int] = []
    pos = 0
    while pos < len(content):
        b = content[pos]
        if b <= 0x7F:
            v, pos = b, pos + 1
        elif 0xCC <= b <= 0xD3:
            width = 1 << ((b - 0xCC) & 3)
            if len(content) - pos - 1 < width:
                break
            v = int.from_bytes(content[pos + 1 : pos + 1 + width], "big")
            pos += 1 + width
            if b >= 0xD0 and v >> (8 * width - 1):
                break
        else:
            break
        if v >> 32:
            break
        ids.append(v)
    return array("I", ids[: len(ids) - len(ids) % granule])


_INT_FORMS = st.sampled_from(["fix", "cc", "cd", "ce", "cf", "d0", "d1", "d2", "d3", "neg", "junk"])


@st.composite
def any_ints(draw: st.DrawFn) -> bytes:
    """msgpack ints in every format a writer may use for a value, and bytes that are none."""
    out = bytearray()
    for form in draw(st.lists(_INT_FORMS, max_size=60)):
        width = {"cc": 1, "cd": 2, "ce": 4, "cf": 8, "d0": 1, "d1": 2, "d2": 4, "d3": 8}.get(form)
        if form == "fix":
            out.append(draw(st.integers(0, 0x7F)))
        elif form == "neg":
            out.append(draw(st.integers(0xE0, 0xFF)))
        elif form == "junk":
            out += draw(st.binary(min_size=1, max_size=3))
        else:
            assert width is not None
            out.append(0xCC + ["cc", "cd", "ce", "cf", "d0", "d1", "d2", "d3"].index(form))
            out += draw(st.binary(min_size=width, max_size=width))
    return bytes(out[: draw(st.integers(0, len(out)))])  # cut anywhere, an int too


@given(any_ints(), st.integers(1, 5))
def test_content_ids_read_every_int_format_as_the_reader_does(content: bytes, granule: int) -> None:
    assert content_ids(content, granule) == _ids_read(content, granule)


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
