"""The packing's check that a chunk's columns give its payloads back (`joins_back`) answers as
`join(...) == payloads` does, whatever the columns' bytes and the payloads expected: it walks
and compares without the GIL, and makes no bytes object per payload, but must never let a
chunk that does not come back whole be stored as columns."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_columns import join, joins_back
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
