# cython: language_level=3
"""A sink told of each batch applied in C: `LiveSink`; and `BatchChanges`, a batch's changes
counted in C for it.

The live path (collector/_ingest_live.pyx) tells a sink built on it of each batch through
`batch_applied`, a C call with the batch's fields, where any other sink is handed an
`AppliedBatch` through a Python call. A sink that overrides `batch_applied` in C (the store's
writer, storage/_store_sink.pyx) takes the fields it needs and builds no `AppliedBatch` for a
batch it reads nothing else of; the base builds one and calls `applied`, as for any sink.
A batch applied from its bytes has its changes counted into the stream's `BatchChanges` (C
counts, no dict nor list per batch): `AppliedBatch.changes` is its `as_dict`.
"""

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject

from kvscope.collector.sink import AppliedBatch

cdef object _APPLIED_BATCH = AppliedBatch


@cython.final
@cython.auto_pickle(False)
cdef class BatchChanges:
    """Blocks stored and removed per table by one batch, as `AppliedBatch.changes` holds them."""

    def __cinit__(self):
        self.keys = []
        self.n = self.capacity = 0
        self.counts = NULL

    def __dealloc__(self):
        PyMem_Free(self.counts)

    cdef int reset(self) except -1:
        self.n = 0
        return 0

    cdef Py_ssize_t slot(self, object key) except -1:
        """Where `key`'s counts are (0 for a table not counted yet): a table is found by
        identity first (a batch's keys are interned), as a dict would find it otherwise."""
        cdef list keys = self.keys
        cdef Py_ssize_t i, n = self.n
        cdef long long *counts
        i = interned_slot(keys, n, <PyObject *>key)
        if i >= 0:
            return i
        for i in range(n):
            if keys[i] == key:
                return i
        if n == self.capacity:
            counts = <long long*>PyMem_Realloc(self.counts, 2 * (n + 4) * sizeof(long long))
            if counts is NULL:
                raise MemoryError()
            self.counts = counts
            self.capacity = n + 4
        self.counts[2 * n] = self.counts[2 * n + 1] = 0
        if n < len(keys):
            keys[n] = key
        else:
            keys.append(key)
        self.n = n + 1
        return n

    cpdef dict as_dict(self):
        """The changes as `AppliedBatch.changes`: `{table: [stored, removed]}`, in the order the
        tables were first counted."""
        cdef Py_ssize_t i
        return {self.keys[i]: [self.counts[2 * i], self.counts[2 * i + 1]] for i in range(self.n)}


@cython.auto_pickle(False)
cdef class LiveSink:
    """The base of a sink whose `applied` the live path calls in C (collector/sink.py's
    `EventSink` otherwise)."""

    cdef int batch_applied(self, object stream, object epoch, object seq, object ts,
                           object recv_ts, object payload, object decoded, object changes,
                           object gaps, object view) except -1:
        """`applied` of the `AppliedBatch` of these fields (`changes` a dict, or a
        `BatchChanges` valid during the call only)."""
        if isinstance(changes, BatchChanges):
            changes = (<BatchChanges>changes).as_dict()
        self.applied(
            _APPLIED_BATCH(stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view)
        )
        return 0
