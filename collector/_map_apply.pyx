# cython: language_level=3, boundscheck=False, wraparound=False
"""`apply_batch`: `PrefixMap.apply`'s loop over a batch's events, compiled.

Every live batch the fused path of collector/_replay.pyx leaves goes through it (those a sink
is told of, those of another layout or near the map's limits), and in Python its loop cost more
than the tables' writes it calls. Here each event goes to the tables' C writes
(`TableCore._store` and `_remove`, which `store_chain` and `remove` wrap, as the fused replay of
collector/_replay.pyx calls them), its hashes converted into a buffer on the stack, and the
counters are counted in C and added to the map's (collector/_map_counters.pyx) in one call once
a batch. It does what the Python loop did, event by event and in the same order, down to what a bad event raises after the events before it were
applied (tests/test_map_apply.py holds it to that loop, kept in tests/map_apply_reference.py).
"""

from cpython cimport array as carray
from cpython.object cimport PyObject
from libc.stdint cimport uint64_t

from kvscope.collector._map_counters cimport Counts, MapCounters
from kvscope.collector._table_core cimport TableCore, _is_uint32_array

from kvscope.collector._admit import admit
from kvscope.collector.block_table import BlockTable
from kvscope.collector.sink import ClearReason
from kvscope.collector.types import AllCleared, BlocksRemoved, BlocksStored

cdef object _STORED = BlocksStored
cdef object _REMOVED = BlocksRemoved
cdef object _CLEARED = AllCleared
cdef object _TABLE = BlockTable
cdef object _ALL_BLOCKS_CLEARED = ClearReason.ALL_BLOCKS_CLEARED

cdef enum:
    STACK_HASHES = 256  # an event's hashes are converted on the stack up to this many


cdef extern from "Python.h":
    # (cpython/descrobject.h: what a Struct's field descriptor holds)
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset

    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


cdef extern from "structmember.h":
    enum:
        T_OBJECT_EX  # a field read raises AttributeError when unset (NULL)


cdef Py_ssize_t _offset(cls, str name) except -1:
    """Where a Struct class keeps field `name` in its objects: msgspec lays fields out as
    `__slots__` are, each read by a member descriptor. Read straight, an event's fields cost
    no attribute lookup each."""
    descr = cls.__dict__[name]
    if type(descr) is not _MEMBER or (<PyMemberDescrObject*>descr).d_member.type != T_OBJECT_EX:
        raise TypeError(f"{cls.__name__}.{name} is not a plain field")
    return (<PyMemberDescrObject*>descr).d_member.offset


cdef object _MEMBER = type(BlocksRemoved.__dict__["hashes"])
cdef Py_ssize_t S_HASHES = _offset(BlocksStored, "hashes")
cdef Py_ssize_t S_PARENT = _offset(BlocksStored, "parent")
cdef Py_ssize_t S_TOKEN_IDS = _offset(BlocksStored, "token_ids")
cdef Py_ssize_t S_BLOCK_SIZE = _offset(BlocksStored, "block_size")
cdef Py_ssize_t S_TABLE = _offset(BlocksStored, "table")
cdef Py_ssize_t S_LORA_NAME = _offset(BlocksStored, "lora_name")
cdef Py_ssize_t S_EXTRA_KEYS = _offset(BlocksStored, "extra_keys")
cdef Py_ssize_t S_RAW_HASHES = _offset(BlocksStored, "raw_hashes")
cdef Py_ssize_t S_RAW_PARENT = _offset(BlocksStored, "raw_parent")
cdef Py_ssize_t S_SIGNED_HASHES = _offset(BlocksStored, "signed_hashes")
cdef Py_ssize_t R_HASHES = _offset(BlocksRemoved, "hashes")
cdef Py_ssize_t R_TABLE = _offset(BlocksRemoved, "table")


cdef inline object _field(object event, Py_ssize_t offset, str name):
    """Field `name` of `event` (of the exact Struct class whose `offset` it is)."""
    cdef PyObject* value = (<PyObject**>(<char*><PyObject*>event + offset))[0]
    if value == NULL:  # never set: raise as the attribute does
        return getattr(event, name)
    return <object>value


cdef int _commit(list counts, Py_ssize_t* stored, Py_ssize_t* removed) except -1:
    """Add a run of events' blocks to their table's `[stored, removed]` in the changes."""
    if stored[0]:
        counts[0] += stored[0]
    if removed[0]:
        counts[1] += removed[0]
    stored[0] = removed[0] = 0
    return 0


cdef int _to_uint64s(list hashes, Py_ssize_t n, uint64_t* out) except -1:
    """`hashes` as C uint64s: OverflowError or TypeError for one that is not (as store_chain)."""
    cdef Py_ssize_t i
    for i in range(n):
        out[i] = hashes[i]
    return 0


def apply_batch(prefix_map, batch, epoch=0, degraded=False, recv_ts=None):
    """`PrefixMap.apply(batch, epoch, degraded, recv_ts)`: see there."""
    admit(prefix_map.limits, prefix_map.tables, batch)
    cdef MapCounters counters = prefix_map.counters
    counters.batches += 1
    ts = counters.last_ts = batch.ts
    cdef dict tables = prefix_map.tables
    cdef dict changes = {}
    # What the batch adds to the counters: added before a clear (its `on_clear` may read
    # them) and when the batch ends or raises.
    cdef Counts k
    k.batches = k.stored_events = k.removed_events = k.cleared_events = 0
    k.stored_blocks = k.removed_blocks = 0
    k.signed_hashes = False
    # The last table used: a batch's events mostly share one (and its key object); its blocks
    # stored and removed so far, added to `counts` when another table comes.
    cdef object key = None
    cdef TableCore table = None
    cdef list counts = None
    cdef Py_ssize_t run_stored = 0, run_removed = 0
    cdef uint64_t on_stack[STACK_HASHES]
    cdef Py_ssize_t n, block_size
    cdef double c_ts = 0
    cdef bint have_ts = False, with_tokens
    cdef uint64_t c_parent
    cdef object kind, event_table, hashes, token_ids, block_size_obj, parent
    try:
        for event in batch.events:
            kind = type(event)
            if kind is _CLEARED:
                k.cleared_events += 1
                counters.add(&k)
                prefix_map.clear(
                    _ALL_BLOCKS_CLEARED, batch.seq, batch.ts, epoch, degraded, recv_ts
                )
                tables = prefix_map.tables  # later events of this batch go to the emptied map
                if counts is not None:
                    _commit(counts, &run_stored, &run_removed)
                key = table = counts = None
                continue
            if kind is _STORED:
                event_table = _field(event, S_TABLE, "table")
            elif kind is _REMOVED:
                event_table = _field(event, R_TABLE, "table")
            else:
                event_table = event.table
            if event_table is not key:
                if counts is not None:
                    _commit(counts, &run_stored, &run_removed)
                key = event_table
                found = tables.get(key)
                if found is None:
                    found = tables[key] = _TABLE(key, ts)
                table = <TableCore?>found
                counts = changes.get(key)
                if counts is None:
                    counts = changes[key] = [0, 0]
            if kind is _STORED:
                hashes = _field(event, S_HASHES, "hashes")
                n = len(hashes)
                token_ids = _field(event, S_TOKEN_IDS, "token_ids")
                block_size_obj = _field(event, S_BLOCK_SIZE, "block_size")
                if table is None or type(hashes) is not list or n > STACK_HASHES or not (
                    _is_uint32_array(token_ids) or not block_size_obj
                ):
                    # Another shape (a list of token ids, a long chain; no table, for an event
                    # naming None before any other): as `store_chain` is, or raises.
                    table.store_chain(
                        hashes,
                        _field(event, S_PARENT, "parent"),
                        token_ids,
                        block_size_obj,
                        ts,
                        _field(event, S_LORA_NAME, "lora_name"),
                        _field(event, S_EXTRA_KEYS, "extra_keys"),
                        _field(event, S_RAW_HASHES, "raw_hashes"),
                        _field(event, S_RAW_PARENT, "raw_parent"),
                    )
                else:
                    # `store_chain`'s steps, in its order (so a bad field raises as it does).
                    block_size = block_size_obj
                    if not have_ts:
                        c_ts, have_ts = ts, True
                    _to_uint64s(<list>hashes, n, on_stack)
                    with_tokens = block_size and len(token_ids) == n * block_size
                    parent = _field(event, S_PARENT, "parent")
                    c_parent = parent if parent is not None else 0
                    table._store(
                        on_stack, n, parent is not None, c_parent, with_tokens,
                        (<carray.array>token_ids).data.as_uints if with_tokens else NULL,
                        block_size, c_ts,
                        _field(event, S_LORA_NAME, "lora_name"),
                        _field(event, S_EXTRA_KEYS, "extra_keys"),
                        _field(event, S_RAW_HASHES, "raw_hashes"),
                        _field(event, S_RAW_PARENT, "raw_parent"),
                    )
                if _field(event, S_SIGNED_HASHES, "signed_hashes"):
                    k.signed_hashes = True
                k.stored_events += 1
                k.stored_blocks += n
                run_stored += n
            else:
                hashes = _field(event, R_HASHES, "hashes") if kind is _REMOVED else event.hashes
                n = len(hashes)
                if table is None or type(hashes) is not list or n > STACK_HASHES:
                    table.remove(hashes)
                else:
                    _to_uint64s(<list>hashes, n, on_stack)
                    table._remove(on_stack, n)
                k.removed_events += 1
                k.removed_blocks += n
                run_removed += n
        if counts is not None:
            _commit(counts, &run_stored, &run_removed)
    finally:
        counters.add(&k)
    return changes
