# A stream's counts for the second being rolled up (storage/rollups.py), added to per batch.
#
# Each applied batch's blocks stored and removed per table (`AppliedBatch.changes`) are added
# to per-table sums here, in C, on the ingest thread: no list of the batches' changes is kept
# to be summed at the second's end. Tables are few (tiers x KV groups) and their keys interned,
# so a table's sums are found by a scan that compares keys by identity first.

from cpython.dict cimport PyDict_CheckExact, PyDict_Next
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject, PyTypeObject

from kvscope.collector._slot_attr cimport slot_set
from kvscope.collector._table_core cimport TableCore

from kvscope.collector._live_sink cimport BatchChanges, interned_slot
from kvscope.collector._map_core cimport MapCore

from dataclasses import fields

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import EVERY_BATCH, Span
from kvscope.collector.wire import table_key
from kvscope.storage.rows import RollupRow

cdef object _EVERY_BATCH = EVERY_BATCH
cdef object _ROLLUP_ROW = RollupRow
cdef object _DEFAULT_KEY = table_key("GPU", 0)
cdef object _SPAN = Span
cdef object _TUPLE_NEW = tuple.__new__
cdef object _PREFIX_MAP = PrefixMap
cdef object _BLOCK_TABLE = BlockTable
cdef tuple _NO_BLOCKS = (0, 0, 0)
cdef tuple _NO_CHANGES = (0, 0)
# `RollupRow`'s slots' descriptors, in its fields' order: its rows are made without its
# `__init__`, a Python frame (`_rollup_row`).
cdef tuple _ROW_SLOTS = tuple(RollupRow.__dict__[field.name] for field in fields(RollupRow))


cdef object _rollup_row(tuple values):
    """`RollupRow(*values)`: each slot set as its `__init__` sets it (no defaults, no
    `__post_init__`), without its frame."""
    cdef Py_ssize_t i
    if len(values) != len(_ROW_SLOTS):
        raise TypeError(f"a rollup row of {len(_ROW_SLOTS)} fields, not {len(values)}")
    row = (<PyTypeObject*>_ROLLUP_ROW).tp_new(_ROLLUP_ROW, <PyObject*>(), NULL)
    for i in range(len(values)):
        slot_set(_ROW_SLOTS[i], row, values[i])
    return row


cdef object _second_row(SecondCore core, object key, tuple blocks, tuple changes, object gaps):
    """The row of table `key` for the second `core` counts: its `blocks` (held, hittable,
    orphans) at the second's end, its `changes` (stored, removed) in it."""
    return _rollup_row(
        (
            core.stream,
            core.second,
            key.medium,
            key.group,
            blocks[0],
            blocks[1],
            blocks[2],
            changes[0],
            changes[1],
            core._clears,
            gaps,
        )
    )


cdef dict _table_counts(object view):
    """Blocks, hittable and orphans per table of the map `view` (as its `stats()` counts them):
    a `PrefixMap`'s read from its tables' C fields, with no Python frame (`stats()` runs three
    per table, and builds a `TableStats` of each); another map's from its `stats()`."""
    cdef dict counts = {}, tables
    cdef TableCore core
    if type(view) is _PREFIX_MAP:
        tables = (<MapCore>view).tables
        for key, table in tables.items():
            if type(table) is _BLOCK_TABLE:  # (`BlockTable.stats`, of its fields)
                core = <TableCore>table
                counts[key] = (len(core._slot_of), core.hittable_count, core.orphan_count)
            else:
                s = table.stats()
                counts[key] = (s.blocks, s.hittable, s.orphans)
        return counts
    for key, s in view.stats().items():
        counts[key] = (s.blocks, s.hittable, s.orphans)
    return counts


cdef inline long long _add_at(
    RollupCounts counts, PyObject *key, long long stores, long long removes
) except -1:
    """Add `stores` and `removes` to the sums of table `key`: its slot found by identity (an
    interned key, nearly always), else by `_new_slot`. The one scan of both of `count`'s
    paths (the live path's `BatchChanges`, a mapping's items through `_add`); a function, not
    a method, so that it is called directly, not through the class's table of methods."""
    cdef list keys = counts._keys
    cdef Py_ssize_t slot = interned_slot(keys, PyList_GET_SIZE(keys), key)
    if slot < 0:
        slot = counts._new_slot(<object>key)
    counts._sums[2 * slot] += stores
    counts._sums[2 * slot + 1] += removes
    return stores + removes


cdef class RollupCounts:
    # (its fields: storage/_rollup_counts.pxd)

    def __cinit__(self):
        self._keys = []
        self._sums = NULL
        self._capacity = 0
        self.gaps = 0
        self.view = None

    def __dealloc__(self):
        PyMem_Free(self._sums)

    cpdef long long applied(self, object batch) except -1:
        """Count one `AppliedBatch`; its block-events (blocks stored and removed)."""
        return self.counted(batch.view, batch.gaps, batch.changes)

    cdef long long counted(self, object view, object gaps, object changes) except -1:
        """`applied`, of the batch's fields (the store's sink has no `AppliedBatch`)."""
        self.view = view
        self.gaps += <long long>gaps
        return self.count(changes)

    cpdef long long count(self, object changes) except -1:
        """Add one batch's blocks stored and removed per table (a mapping, or the live path's
        `BatchChanges`); its block-events."""
        cdef Py_ssize_t pos = 0
        cdef PyObject *key
        cdef PyObject *value
        cdef long long events = 0
        cdef BatchChanges counted
        cdef Py_ssize_t i
        if isinstance(changes, BatchChanges):
            counted = <BatchChanges>changes
            for i in range(counted.n):
                events += _add_at(
                    self,
                    PyList_GET_ITEM(counted.keys, i),
                    counted.counts[2 * i],
                    counted.counts[2 * i + 1],
                )
            return events
        if not PyDict_CheckExact(changes):
            for k, v in changes.items():
                events += self._add(k, v)
            return events
        while PyDict_Next(changes, &pos, &key, &value):
            events += self._add(<object>key, <object>value)
        return events

    cdef long long _add(self, object key, object counts) except -1:
        cdef long long stores, removes
        if PyList_CheckExact(counts) and PyList_GET_SIZE(counts) == 2:
            stores = <object>PyList_GET_ITEM(counts, 0)
            removes = <object>PyList_GET_ITEM(counts, 1)
        else:
            stores, removes = counts
        return _add_at(self, <PyObject *>key, stores, removes)

    cdef Py_ssize_t _new_slot(self, object key) except -1:
        """The slot of `key`, not found by identity: an equal key's (one not interned), else a
        new one."""
        cdef list keys = self._keys
        cdef Py_ssize_t i, n = len(keys)
        for i in range(n):
            if keys[i] == key:
                return i
        if n == self._capacity:
            sums = <long long*>PyMem_Realloc(self._sums, 2 * (n + 4) * sizeof(long long))
            if sums is NULL:
                raise MemoryError()
            self._sums = sums
            self._capacity = n + 4
        self._sums[2 * n] = self._sums[2 * n + 1] = 0
        keys.append(key)
        return n

    cpdef tuple take(self):
        """The sums per table since the last take (tables with none left out), and the gaps;
        both start again from 0."""
        cdef Py_ssize_t i
        sums = {}
        for i in range(len(self._keys)):
            if self._sums[2 * i] or self._sums[2 * i + 1]:
                sums[self._keys[i]] = (self._sums[2 * i], self._sums[2 * i + 1])
            self._sums[2 * i] = self._sums[2 * i + 1] = 0
        gaps, self.gaps = self.gaps, 0
        return sums, gaps


cdef class SecondCore:
    """The base of storage/rollups.py's `SecondRollup`: the call at each second's end
    (`instant`), the rows of the second that ended (`_rows`) and the span it hands back, in C,
    for the store's sink to call as C calls."""

    # (its fields: storage/_rollup_counts.pxd)

    def instant(self, view, ts):
        """Before a batch stamped `ts`: if it opens a new second, the rows of the one before
        (`view` is the map after that second's last batch)."""
        return self.rows_before(view, ts)

    def span(self):
        """The stamps of the current second (`int` truncates towards 0: below 0 the stamps of
        a second end at it, so any stamp there asks again)."""
        return self.span_of()

    def _rows(self, view):
        """The rows of the second being counted, its map `view`."""
        if self.second is None:
            raise ValueError("no second is being counted")
        return self.rows_of(view)

    cdef list rows_before(self, object view, object ts):
        if self.counts is None:  # (a C field's write: no check of its own)
            raise ValueError("a rollup without counts")
        self.counts.view = view
        second = int(ts)
        if second == self.second:
            return []
        rows = [] if self.second is None else self.rows_of(view)
        self.second = second
        return rows

    cdef list rows_of(self, object view):
        """A row per table that the map holds (in its order) or the second changed, else one of
        `_DEFAULT_KEY`'s. Clears and gaps belong to the stream and are repeated on each of its
        rows (take the max over tiers, not the sum)."""
        cdef dict tables = _table_counts(view)
        cdef tuple taken = self.counts.take()
        cdef dict changes = taken[0]
        gaps = taken[1]
        cdef list rows = []
        for key, blocks in tables.items():
            rows.append(_second_row(self, key, blocks, changes.get(key, _NO_CHANGES), gaps))
        for key, counted in changes.items():
            if key not in tables:
                rows.append(_second_row(self, key, _NO_BLOCKS, counted, gaps))
        if not rows:
            rows.append(_second_row(self, _DEFAULT_KEY, _NO_BLOCKS, _NO_CHANGES, gaps))
        self._clears = 0
        return rows

    cdef object span_of(self):
        second = self.second
        if second is None or second < 0:
            return _EVERY_BATCH
        # Float bounds: the collector compares each batch's stamp with them, and a float
        # compared with an int past 2**30 converts it each time. Made as `Span`'s own
        # `__new__` makes it, without its Python frame.
        return _TUPLE_NEW(_SPAN, (float(second), float(second + 1)))
