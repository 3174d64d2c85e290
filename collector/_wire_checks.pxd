# The checks that the compiled decoder (collector/_wire_fast.pyx) and the fused replay's first
# pass (collector/_fused_read.pyx) share (collector/_wire_checks.pyx), so that both accept
# exactly the same batches.
from libc.stdint cimport int64_t, uint64_t

from kvscope.collector._msgpack cimport Reader
from kvscope.collector._wire_scan cimport Event


cdef struct StoredFields:
    # A BlockStored's fields as check_stored reads them (hashes and tokens are left where the
    # scan put them: held in the event, or to read at its `at`).
    Py_ssize_t n_hashes, n_tokens
    bint has_parent
    uint64_t parent
    int64_t block_size


cdef int check_stored(Reader* r, Event* e, int64_t max_block_size,
                      StoredFields* s) noexcept nogil
cdef int read_head(Reader* r, Py_ssize_t* n_top, double* ts, Py_ssize_t* n_events) noexcept nogil
cdef int read_tail(Reader* r, Py_ssize_t n_top, bint* rank_nil, int64_t* rank) noexcept nogil
