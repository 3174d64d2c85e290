from collections.abc import Mapping, Sequence
from typing import Any

from kvscope.collector.sink import Span
from kvscope.storage.rows import RollupRow

class RollupCounts:
    gaps: int
    view: Any
    def applied(self, batch: Any) -> int: ...
    def count(self, changes: Mapping[Any, Sequence[int]]) -> int: ...
    def take(self) -> tuple[dict[Any, tuple[int, int]], int]: ...

class SecondCore:
    """The base of `SecondRollup`: `instant` and `span` in C."""

    stream: Any
    second: int | None
    counts: RollupCounts
    _clears: int
    def _rows(self, view: Any) -> list[RollupRow]:
        """The rows of the second being counted, its map `view`."""
    def instant(self, view: Any, ts: float) -> list[RollupRow]:
        """Before a batch stamped `ts`: if it opens a new second, the rows of the one before."""
    def span(self) -> Span:
        """The stamps of the current second."""
