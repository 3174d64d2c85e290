"""`RollupCounts` (storage/_rollup_counts.pyx), declared for the store's sink
(storage/_store_sink.pyx), which counts each batch in C."""


cdef class RollupCounts:
    # The tables seen, in the order first seen; the sums of `_keys[i]` are at `_sums[2 * i]`.
    cdef list _keys
    cdef long long *_sums
    cdef Py_ssize_t _capacity
    # Gaps in the stream's seqs told since the counts were last taken.
    cdef readonly long long gaps
    # The map of the last batch counted, or instant seen (what a second still open at close is
    # read from).
    cdef public object view

    cpdef long long applied(self, object batch) except -1
    cdef long long counted(self, object view, object gaps, object changes) except -1
    cpdef long long count(self, object changes) except -1
    cdef long long _add(self, object key, object counts) except -1
    cdef Py_ssize_t _new_slot(self, object key) except -1
    cpdef tuple take(self)


cdef class SecondCore:
    cdef public object stream
    # The second being counted (None: none yet).
    cdef public object second
    cdef public RollupCounts counts
    # `AllBlocksCleared`s in the second (restarts are not counted).
    cdef public long long _clears

    cdef list rows_before(self, object view, object ts)
    cdef list rows_of(self, object view)
    cdef object span_of(self)
