# A stream's counts for the second being rolled up (storage/rollups.py), added to per batch.
#
# Each applied batch's blocks stored and removed per table (`AppliedBatch.changes`) are added
# to per-table sums here, in C, on the ingest thread: no list of the batches' changes is kept
# to be summed at the second's end. Tables are few (tiers x KV groups) and their keys interned,
# so a table's sums are found by a scan that compares keys by identity first.

from cpython.dict cimport PyDict_CheckExact, PyDict_Next
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject

from kvscope.collector._live_sink cimport BatchChanges


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
                events += self._add_counts(
                    counted.keys[i], counted.counts[2 * i], counted.counts[2 * i + 1]
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
        return self._add_counts(key, stores, removes)

    cdef long long _add_counts(self, object key, long long stores, long long removes) except -1:
        cdef Py_ssize_t i = self._slot(key)
        self._sums[2 * i] += stores
        self._sums[2 * i + 1] += removes
        return stores + removes

    cdef Py_ssize_t _slot(self, object key) except -1:
        cdef list keys = self._keys
        cdef Py_ssize_t i, n = len(keys)
        for i in range(n):
            if keys[i] is key:
                return i
        for i in range(n):  # an equal key that is not the interned one
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

    def take(self):
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
