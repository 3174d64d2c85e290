# The checks that the compiled decoder (collector/_wire_fast.pyx) and the fused replay's first
# pass (collector/_fused_read.pyx) share (collector/_wire_checks.pyx), so that both accept
# exactly the same batches.
from libc.math cimport fabs
from libc.stdint cimport int64_t, uint64_t

from kvscope.collector._msgpack cimport (
    Reader,
    at,
    be64,
    read_array,
    read_float,
    read_int64,
    read_nil,
    read_uint64,
    skip,
)
from kvscope.collector._wire_scan cimport F_HASHES, F_PARENT, F_TOKENS, HELD, UNREAD, Event


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


cdef int count_uints(Reader* r, Py_ssize_t pos, bint tokens, Py_ssize_t* n) noexcept nogil
cdef int check_stored(Reader* r, Event* e, int64_t max_block_size,
                      StoredFields* s) noexcept nogil


# check_stored in three parts: the fields an event's tail holds (`stored_fixed`, whose verdict a
# tail's memo keeps: collector/_wire_scan.pxd's `TailMemo`), and those it does not (inline).
cdef int stored_fixed(Reader* r, Event* e, int64_t* block_size,
                      Py_ssize_t* extra_keys) noexcept nogil


cdef inline int stored_counts(Reader* r, Event* e, StoredFields* s) noexcept nogil:
    """A BlockStored's hashes and token ids counted (each checked as the decoder reads it), and
    its parent read: 0, or -1 if one is off."""
    cdef Reader f
    cdef Py_ssize_t pos
    if e.hashes_state == HELD:
        s.n_hashes = e.n_hashes
    elif e.hashes_state != UNREAD or count_uints(r, e.at[F_HASHES], False, &s.n_hashes) < 0:
        return -1
    s.n_tokens = 0
    if e.at[F_TOKENS] >= 0:
        if e.tokens_state == HELD:
            s.n_tokens = e.n_tokens
        elif e.tokens_state != UNREAD or count_uints(r, e.at[F_TOKENS], True, &s.n_tokens) < 0:
            return -1
    s.has_parent, s.parent = False, 0
    pos = e.at[F_PARENT]
    if pos >= 0:
        # A uint64 read here, as senders write a hash; any other int by read_uint64.
        if r.end - pos >= 9 and r.p[pos] == 0xCF:
            s.parent = be64(r.p + pos + 1)
            s.has_parent = True
        else:
            f = at(r, pos)
            if not read_nil(&f):
                if read_uint64(&f, &s.parent) < 0:
                    return -1
                s.has_parent = True
    return 0


cdef inline int stored_fit(StoredFields* s, int64_t max_block_size,
                           Py_ssize_t extra_keys) noexcept nogil:
    """Whether `stored_fixed`'s block_size (in `s`, -1 when absent) and extra_keys fit the counts and the decoder's limit:
    0, or -1."""
    cdef int64_t span
    if s.block_size < 0:  # absent
        s.block_size = 0
    elif s.block_size > max_block_size:
        return -1
    if extra_keys >= 0 and extra_keys != s.n_hashes:
        return -1
    # As many token ids as the blocks hold: none, block_size per hash, or whole blocks more
    # (wire_rules.token_ids_of).
    span = s.block_size * s.n_hashes
    if s.n_tokens and s.n_tokens != span and not (
        s.block_size and s.n_tokens % s.block_size == 0 and s.n_tokens > span
    ):
        return -1
    return 0


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
