"""The packing's check that a chunk's columns give its payloads back (`joins_back`) answers as
`join(...) == payloads` does, whatever the columns' bytes and the payloads expected: it walks
and compares without the GIL, and makes no bytes object per payload, but must never let a
chunk that does not come back whole be stored as columns."""

from __future__ import annotations

from array import array

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kvscope.storage import log_columns
from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_columns import join, joins_back
from kvscope.storage.log_columns import NO_GRANULES
from tests.log_columns_support import FORMAT_3, FORMAT_4, Damaged, damaged_columns
from tests.test_log_columns import SETTINGS


def joined_equal(
    expected: list[bytes], columns: list[bytes], granules: GranuleIndex | None
) -> bool:
    try:
        return join(len(expected), *columns, granules=granules) == expected
    except ValueError:
        return False


def test_whole_columns_join_back_and_others_do_not() -> None:
    for payloads, columns, granules in (FORMAT_3, FORMAT_4):
        assert joins_back(payloads, *columns, granules=granules)
        assert not joins_back(payloads[:-1], *columns, granules=granules)
        assert not joins_back([*payloads, payloads[0]], *columns, granules=granules)
        other = [*payloads]
        other[7] = other[7][:-1] + bytes([other[7][-1] ^ 1])
        assert not joins_back(other, *columns, granules=granules)
        assert joins_back([], b"", b"", b"", b"", b"", b"", granules=granules)


@SETTINGS
@given(damaged_columns(), st.integers(0, 1 << 20))
def test_joins_back_answers_as_join_does(chunk: Damaged, changed: int) -> None:
    payloads, columns, damaged, granules, count_off = chunk
    expected = payloads[: len(payloads) + count_off] if count_off < 0 else [*payloads]
    expected += payloads[:count_off] if count_off > 0 else []
    for candidate in (columns, damaged):
        assert joins_back(expected, *candidate, granules=granules) == joined_equal(
            expected, candidate, granules
        )
    if expected:
        k = changed % len(expected)
        expected[k] = expected[k][:-1]
        assert not joins_back(expected, *columns, granules=granules)


def test_a_payload_kept_verbatim_midway_leaves_the_checked_runs_in_step() -> None:
    """A payload whose walk put a token run before it stopped reading is kept verbatim, its
    run taken back: the check of the packed chunk reads the split's record of each run kept,
    and must find the next payload's runs where they are (else every payload goes verbatim)."""
    good = msgspec.msgpack.encode([{"ids": list(range(300, 340))}, [7, 8, 9]])
    stops = msgspec.msgpack.encode([list(range(500, 520))]) + b"\xc1"
    after = msgspec.msgpack.encode({"ids": list(range(1000, 1064)), "h": 2**63 + 5})
    payloads = [good, stops, after, good]
    n = len(payloads)
    stamps = array("q", range(n)), array("d", [0.0] * n), array("d", [0.0] * n)
    for granules in (None, NO_GRANULES):
        frames, verbatim = log_columns.columns(*stamps, payloads, granules)
        assert verbatim == 1
        assert join(n, *frames[1:8], granules=granules) == payloads
