from array import array
from collections.abc import Iterable

from kvscope.collector._slot_map import SlotMap
from kvscope.collector._table_core import TableCore

def count_cached(table: TableCore, hashes: Iterable[int]) -> int:
    """How many of `hashes` are cached in `table`."""

def hittable_weight(table: TableCore, weights: dict[int, int]) -> int:
    """The sum of `weights[h]` over the hashes `h` of `weights` hittable in `table`."""

def add_group_counts(table: TableCore, marks: SlotMap, counts: array[int]) -> None:
    """Adds, per group `g` of `marks` (hash -> g * 2, plus 1 if shared: `chain_groups`'), its
    blocks cached in `table` to `counts[3g]`, those hittable to `counts[3g + 1]` and those
    hittable and shared to `counts[3g + 2]` (`counts`: an `array("i")`)."""
