# cython: language_level=3
"""`admit`: the pass over a batch that `PrefixMap.apply` makes first, to refuse one that could
take the map past its limits (collector/limits.py).

Compiled because it runs on every batch: in Python it cost a third of applying one. It reads the
tables' sizes through the C fields _table_core.pxd declares.
"""

from kvscope.collector._table_core cimport TableCore

from kvscope.collector.block_table import extras_bytes
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.types import AllCleared, BlocksStored

cdef object _STORED = BlocksStored
cdef object _CLEARED = AllCleared


cdef tuple _over(dict tables, set new_tables, Py_ssize_t blocks, Py_ssize_t content,
                 Py_ssize_t max_tables, Py_ssize_t max_blocks, Py_ssize_t max_content):
    """(limit, held, adding) for the first limit passed, or None."""
    cdef Py_ssize_t held_blocks = 0, held_content = 0
    cdef TableCore table
    if new_tables is not None and len(tables) + len(new_tables) > max_tables:
        return ("max_tables_per_stream", len(tables), len(new_tables))
    if blocks or content:
        for value in tables.values():
            table = <TableCore?>value
            held_blocks += table._slot_of._size
            held_content += table.token_bytes()
        if held_blocks + blocks > max_blocks:
            return ("max_blocks_per_stream", held_blocks, blocks)
        if held_content + content > max_content:
            return ("max_token_bytes_per_stream", held_content, content)
    return None


def admit(limits, dict tables, batch):
    """Raise MalformedPayload (LIMIT_EXCEEDED, the limit named) if applying `batch` to a map of
    `tables` could take it past `limits` (an `IngestLimits`).

    A BlockStored counts all its blocks as new and all its contents (tokens, LoRA name, extra
    keys) as kept: an upper bound that costs one pass over the events, not a lookup per hash.
    After an AllBlocksCleared the map is counted from empty."""
    cdef Py_ssize_t max_tables = limits.max_tables_per_stream
    cdef Py_ssize_t max_blocks = limits.max_blocks_per_stream
    cdef Py_ssize_t max_content = limits.max_token_bytes_per_stream
    cdef Py_ssize_t blocks = 0, content = 0, n
    cdef set new_tables = None
    cdef object kind, key, last = None
    cdef tuple found
    for event in batch.events:
        kind = type(event)
        if kind is _CLEARED:
            found = _over(tables, new_tables, blocks, content, max_tables, max_blocks, max_content)
            if found is not None:
                _refuse(limits, found)
            tables, new_tables, blocks, content, last = {}, None, 0, 0, None
            continue
        if kind is _STORED:
            n = len(event.hashes)
            blocks += n
            content += 4 * len(event.token_ids)
            if event.lora_name is not None or event.extra_keys is not None:
                for extra in event.extra_keys or [None] * n:
                    content += extras_bytes(event.lora_name, extra)
        key = event.table
        if key is not last:  # a batch's events mostly share one table
            last = key
            if key not in tables:
                if new_tables is None:
                    new_tables = set()
                new_tables.add(key)
    found = _over(tables, new_tables, blocks, content, max_tables, max_blocks, max_content)
    if found is not None:
        _refuse(limits, found)


cdef _refuse(limits, tuple found):
    limit, held, adding = found
    detail = f"{limit}={getattr(limits, limit)}: the map holds {held}, the batch adds {adding}"
    raise MalformedPayload(MalformedKind.LIMIT_EXCEEDED, detail)
