# cython: language_level=3
"""`admit`: the check that `PrefixMap.apply` makes first, to refuse a batch that could take the
map past its limits (collector/limits.py) before anything of it is applied.

It runs on every batch, so it is compiled, reads the tables' sizes through the C fields that
_table_core.pxd declares, and mostly makes no pass over the events: a batch names at most a
table an event, and one decoded from `payload_bytes` of msgpack stores at most that many blocks
(a hash takes a byte at least) and holds at most 8 bytes of contents a byte (4 a token id of a
byte or more; extra keys are counted at most 8 a byte). While the map is that far from its
limits the batch is admitted; nearer, its events are counted.
"""

from kvscope.collector._table_core cimport TableCore, content_bytes

from kvscope.collector.block_table import extras_bytes
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.types import AllCleared, BlocksStored

cdef object _STORED = BlocksStored
cdef object _CLEARED = AllCleared

cdef Py_ssize_t CONTENT_PER_BYTE = 8

# The limits last read: maps share one IngestLimits, read again only when another comes.
cdef object _limits = None
cdef Py_ssize_t _max_tables, _max_blocks, _max_content


cdef int _read(limits) except -1:
    global _limits, _max_tables, _max_blocks, _max_content
    _max_tables = limits.max_tables_per_stream
    _max_blocks = limits.max_blocks_per_stream
    _max_content = limits.max_token_bytes_per_stream
    _limits = limits
    return 0


def admit(limits, dict tables, batch):
    """Raise MalformedPayload (LIMIT_EXCEEDED, the limit named) if applying `batch` to a map of
    `tables` could take it past `limits` (an `IngestLimits`).

    Counted event by event, a BlockStored counts all its blocks as new and all its contents
    (tokens, extra keys) as kept: an upper bound, with no lookup per hash. After an
    AllBlocksCleared the map is counted from empty."""
    cdef list events = batch.events
    if not roomy(limits, tables, len(events), batch.payload_bytes):
        _count(limits, tables, events)


cdef int roomy(limits, dict tables, Py_ssize_t n_events, Py_ssize_t size) except -1:
    """1 when a batch of `n_events` events decoded from `size` bytes (0: unknown) cannot take a
    map of `tables` past `limits`, whatever it holds; 0 when its events must be counted."""
    if limits is not _limits:
        _read(limits)
    cdef Py_ssize_t held_blocks = 0, held_content = 0
    cdef TableCore table
    if size and len(tables) + n_events <= _max_tables:
        for value in tables.values():
            table = <TableCore?>value
            held_blocks += table._slot_of._size
            held_content += content_bytes(table)
        if (
            held_blocks + size <= _max_blocks
            and held_content + CONTENT_PER_BYTE * size <= _max_content
        ):
            return 1
    return 0


cdef _count(limits, dict tables, list events):
    """Count what `events` could add, event by event, and refuse past a limit."""
    cdef Py_ssize_t blocks = 0, content = 0, n
    cdef set new_tables = None
    cdef object kind, key, last = None
    for event in events:
        kind = type(event)
        if kind is _CLEARED:
            _check(limits, tables, new_tables, blocks, content)
            tables, new_tables, blocks, content, last = {}, None, 0, 0, None
            continue
        if kind is _STORED:
            n = len(event.hashes)
            blocks += n
            content += 4 * len(event.token_ids)
            if event.extra_keys is not None:
                for extra in event.extra_keys:
                    content += extras_bytes(extra)
        key = event.table
        if key is not last:  # a batch's events mostly share one table
            last = key
            if key not in tables:
                if new_tables is None:
                    new_tables = set()
                new_tables.add(key)
    _check(limits, tables, new_tables, blocks, content)


cdef _check(limits, dict tables, set new_tables, Py_ssize_t blocks, Py_ssize_t content):
    cdef Py_ssize_t held_blocks = 0, held_content = 0
    cdef TableCore table
    if new_tables is not None and len(tables) + len(new_tables) > _max_tables:
        _refuse(limits, "max_tables_per_stream", len(tables), len(new_tables))
    if not blocks and not content:
        return
    for value in tables.values():
        table = <TableCore?>value
        held_blocks += table._slot_of._size
        held_content += content_bytes(table)
    if held_blocks + blocks > _max_blocks:
        _refuse(limits, "max_blocks_per_stream", held_blocks, blocks)
    if held_content + content > _max_content:
        _refuse(limits, "max_token_bytes_per_stream", held_content, content)


cdef _refuse(limits, str limit, Py_ssize_t held, Py_ssize_t adding):
    detail = f"{limit}={getattr(limits, limit)}: the map holds {held}, the batch adds {adding}"
    raise MalformedPayload(MalformedKind.LIMIT_EXCEEDED, detail)
