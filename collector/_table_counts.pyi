from array import array

from kvscope.collector._slot_map import SlotMap
from kvscope.collector._table_core import TableCore

def count_cached(table: TableCore, hashes: array[int], hittable: bool = False) -> int:
    """How many of `hashes` (an `array("Q")`) are cached in `table` (`hittable`: and
    hittable)."""

def hittable_hash_array(table: TableCore) -> array[int]:
    """The hittable hashes as a new `array("Q")`, in the slot map's order."""

def add_group_counts(table: TableCore, marks: SlotMap, counts: array[int]) -> None:
    """Adds, per group `g` of `marks` (hash -> g * 2, plus 1 if shared: `chain_groups`'), its
    blocks cached in `table` to `counts[3g]`, those hittable to `counts[3g + 1]` and those
    hittable and shared to `counts[3g + 2]` (`counts`: an `array("i")`)."""
