from kvscope.collector._slot_map import SlotMap
from kvscope.collector._table_core import TableCore

def chain_groups(table: TableCore, first: int) -> tuple[SlotMap, list[int], list[int], list[int]]:
    """(hash -> its group * 2, plus 1 if it is shared, as a slot map; each group's root, size
    and shared blocks), groups numbered from `first`: the marks a follower counts a table
    against (collector/_table_counts.pyx's `add_group_counts`), made with the groups."""
