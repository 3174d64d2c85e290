# The fast half of the limits check (collector/_admit.pyx), for the fused replay
# (collector/_replay.pyx): a batch it does not find roomy goes through `admit` whole.
cdef int roomy(limits, dict tables, Py_ssize_t n_events, Py_ssize_t size) except -1
