"""`LiveSink` and `BatchChanges` (collector/_live_sink.pyx), declared for the live path
(collector/_ingest_live.pyx), which tells such a sink of each batch in C, for the apply that
counts a batch's changes (collector/_replay.pyx), and for the sinks built on it (storage/)."""


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
