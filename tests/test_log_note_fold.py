"""The content's note reads the token runs the log's split found (the payloads are walked once)
where the split proves the note would read the payload the same way, and walks the payload
apart where it may not: what is noted, and so what is stored, is the same either way
(tests/test_log_note_in_walk.py compares the bytes)."""

from __future__ import annotations

import random

import msgspec
import pytest

from kvscope.storage import _log_columns
from kvscope.storage.log_dictionary import GRANULE
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow
from tests.test_log_dictionary import payload, stored
from tests.test_log_note_in_walk import STREAMS, batches, odd_payload


class _Kind(random.Random):
    """A generator whose first `randrange` picks `odd_payload`'s kind."""

    def __init__(self, kind: int) -> None:
        super().__init__(kind)
        self.kind: int | None = kind

    def randrange(self, *args: int, **kwargs: int) -> int:  # type: ignore[override]
        if self.kind is not None:
            kind, self.kind = self.kind, None
            return kind
        return super().randrange(*args, **kwargs)


def _read(rows: list[LogRow]) -> tuple[int, int]:
    """(payloads noted from the split's walk, payloads the note walked apart) in `rows`' pack."""
    packer = LogPacker(cap=60_000, ratio=0.5)
    before = _log_columns.notes_read()
    packer.pack(rows)
    after = _log_columns.notes_read()
    return after[0] - before[0], after[1] - before[1]


def _rows(payloads: list[bytes]) -> list[LogRow]:
    return [(STREAMS[0], 0, seq, 1000.0 + seq, 1000.0 + seq, p) for seq, p in enumerate(payloads)]


def test_vllm_batches_are_noted_from_the_split_s_walk() -> None:
    rows = batches(random.Random(7), 300, 0.0)
    folded, walked = _read(rows)
    assert walked == 0
    assert folded == len(rows)  # the content is short of its cap: every batch noted


def test_negative_ids_are_read_in_the_split_and_noted_as_none() -> None:
    tokens = list(range(1, 3 * GRANULE + 1))
    rows = _rows([payload([stored([-t for t in tokens], [7 << 40])]) for _ in range(4)])
    assert _read(rows) == (4, 0)


@pytest.mark.parametrize(
    "kind",
    [
        0,  # an id as a 64-bit int: the split reads it as a hash
        2,  # nesting near the note's depth
        3,  # a value after the first, which the note does not read
        4,  # cut short
        5,  # not msgpack
    ],
)
def test_payloads_the_note_may_read_otherwise_are_walked_apart(kind: int) -> None:
    rng = random.Random(kind)
    tokens = [rng.randrange(70_000) for _ in range(2 * GRANULE + 3)]
    odd = [odd_payload(_Kind(kind), tokens) for _ in range(3)]
    usual = msgspec.msgpack.encode([1.0, [stored(tokens, [5 << 40])], 0])
    assert _read(_rows([usual, *odd, usual])) == (2, 3)
