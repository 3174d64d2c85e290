from kvscope.collector._table_core import TableCore

def chain_groups(
    table: TableCore, first: int
) -> tuple[dict[int, int], set[int], list[int], list[int], list[int]]:
    """(hash -> group, the shared hashes, each group's root, size and shared blocks), groups
    numbered from `first`."""
