# A map's counters (collector/_map_counters.pyx) as C fields, for the compiled apply paths
# (collector/_map_apply.pyx, collector/_replay.pyx): they count a batch into a `Counts` and add
# it in one call, not a Python attribute write per field.

cdef struct Counts:
    # What batches add to a map's counters until `MapCounters.add`.
    Py_ssize_t batches, stored_events, removed_events, cleared_events
    Py_ssize_t stored_blocks, removed_blocks
    bint signed_hashes


cdef class MapCounters:
    cdef public Py_ssize_t batches, stored_events, removed_events, cleared_events
    cdef public Py_ssize_t stored_blocks, removed_blocks, clears
    cdef public object last_ts
    cdef public bint signed_hashes

    cdef int add(self, Counts* k) except -1
