from collections.abc import Iterable

from kvscope.collector._table_core import TableCore

def count_cached(table: TableCore, hashes: Iterable[int]) -> int:
    """How many of `hashes` are cached in `table`."""

def hittable_weight(table: TableCore, weights: dict[int, int]) -> int:
    """The sum of `weights[h]` over the hashes `h` of `weights` hittable in `table`."""
