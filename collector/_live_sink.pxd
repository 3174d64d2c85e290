"""`LiveSink` and `BatchChanges` (collector/_live_sink.pyx), declared for the live path
(collector/_ingest_live.pyx), which tells such a sink of each batch in C, for the apply that
counts a batch's changes (collector/_replay.pyx), and for the sinks built on it (storage/)."""

from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject


cdef inline Py_ssize_t interned_slot(list keys, Py_ssize_t n, PyObject *key) noexcept:
    """Where table `key` is among the first `n` of `keys` by identity (a batch's table keys are
    interned: nearly always found so), -1 if none is that object. For `BatchChanges` and the
    store's rollup counts (storage/_rollup_counts.pyx), which then compare by equality."""
    cdef Py_ssize_t i
    for i in range(n):
        if PyList_GET_ITEM(keys, i) == key:
            return i
    return -1


cdef class BatchChanges:
    # The tables counted, in the order first counted (overwritten in place, not emptied, as
    # a batch's keys are); the first `n` are this batch's, their counts at `counts[2 * i]`
    # (stored) and `counts[2 * i + 1]` (removed).
    cdef list keys
    cdef Py_ssize_t n
    cdef Py_ssize_t capacity
    cdef long long *counts

    cdef Py_ssize_t slot(self, object key) except -1
    cdef int reset(self) except -1
    cpdef dict as_dict(self)


cdef class LiveSink:
    cdef int batch_applied(self, object stream, object epoch, object seq, object ts,
                           object recv_ts, object payload, object decoded, object changes,
                           object gaps, object view) except -1
