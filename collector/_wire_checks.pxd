# The checks that the compiled decoder (collector/_wire_fast.pyx) and the fused replay's first
# pass (collector/_fused_read.pyx) share (collector/_wire_checks.pyx), so that both accept
# exactly the same batches.
from libc.math cimport fabs
from libc.stdint cimport int64_t, uint64_t

from kvscope.collector._msgpack cimport Reader, read_array, read_float, read_int64, read_nil, skip
from kvscope.collector._wire_scan cimport Event


cdef extern from *:
    """
    #define KVSCOPE_MAX_ABS_TS 9007199254740992.0
    #define KVSCOPE_MAX_RANK 65535
    """
    # The rules' bounds (collector/wire_rules.py's MAX_ABS_TS and MAX_RANK) as C constants,
    # for the inline reads below; _wire_checks.pyx refuses to import if they differ.
    const double MAX_ABS_TS "KVSCOPE_MAX_ABS_TS"
    const int64_t MAX_RANK "KVSCOPE_MAX_RANK"


cdef struct StoredFields:
    # A BlockStored's fields as check_stored reads them (hashes and tokens are left where the
    # scan put them: held in the event, or to read at its `at`).
    Py_ssize_t n_hashes, n_tokens
    bint has_parent
    uint64_t parent
    int64_t block_size


cdef int check_stored(Reader* r, Event* e, int64_t max_block_size,
                      StoredFields* s) noexcept nogil


# A batch's head and tail, once a batch each: inline, as the reads they make are (a call into
# another module cost about as much as they do).
cdef inline int read_head(Reader* r, Py_ssize_t* n_top, double* ts,
                          Py_ssize_t* n_events) noexcept nogil:
    """A batch's array header, ts and events' array header: 0, or -1 to decline."""
    if read_array(r, n_top) < 0 or n_top[0] < 2:
        return -1
    # NaN fails the comparison too
    if read_float(r, ts) < 0 or not fabs(ts[0]) <= MAX_ABS_TS or read_array(r, n_events) < 0:
        return -1
    return 0


cdef inline int read_tail(Reader* r, Py_ssize_t n_top, bint* rank_nil,
                          int64_t* rank) noexcept nogil:
    """What follows a batch's events: its rank, if there, then fields a later vLLM may add, to
    the payload's end. 0, or -1 to decline."""
    cdef Py_ssize_t k
    rank_nil[0] = n_top < 3 or read_nil(r)
    if not rank_nil[0]:
        if read_int64(r, rank) < 0 or not 0 <= rank[0] <= MAX_RANK:
            return -1
    for k in range(n_top - 3):  # fields of a later vLLM: msgspec skips them too
        if skip(r, 1) < 0:
            return -1
    return 0 if r.pos == r.end else -1  # trailing bytes
