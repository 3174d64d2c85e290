# cython: language_level=3, boundscheck=False, wraparound=False
"""The checks that decide whether a map-layout batch is the compiled decoder's
(collector/_wire_fast.pyx): the fields of a BlockStored that need no Python object (a batch's
head and tail are read inline, in _wire_checks.pxd). The fused replay's first pass
(collector/_fused_read.pyx) runs the same ones, through _wire_checks.pxd, so that both accept
exactly the same batches. Each returns 0, or -1 to decline: the caller then decodes the payload
the slow way, which alone judges it.
"""

from libc.stdint cimport int64_t, uint64_t

from kvscope.collector._msgpack cimport (
    Reader,
    at,
    be64,
    read_array,
    read_int,
    read_int64,
    read_nil,
    read_uint64,
)
from kvscope.collector._wire_scan cimport (
    F_BLOCK_SIZE,
    F_CACHE_SALT,
    F_EXTRA_KEYS,
    F_HASHES,
    F_LORA_ID,
    F_PARENT,
    F_TOKENS,
    HELD,
    UNREAD,
    Event,
)

from kvscope.collector import wire_rules

# The rules' bounds, which the inline reads of _wire_checks.pxd hold as C constants.
if MAX_ABS_TS != wire_rules.MAX_ABS_TS or MAX_RANK != wire_rules.MAX_RANK:
    raise ImportError("_wire_checks.pxd's bounds differ from collector/wire_rules.py's")


cdef int check_stored_extras(Reader* r, Event* e, Py_ssize_t n_hashes) noexcept nogil:
    """The fields of a BlockStored that only need checking: lora_id is an int or nil, extra_keys
    nil or a nil per hash (what the rules reduce to None; other extra keys are the slow path's)."""
    cdef Reader f
    cdef Py_ssize_t n, k
    cdef int64_t i
    cdef uint64_t u
    cdef bint unsigned
    if e.at[F_LORA_ID] >= 0:
        f = at(r, e.at[F_LORA_ID])
        if not read_nil(&f) and read_int(&f, &i, &u, &unsigned) < 0:
            return -1
    if e.at[F_EXTRA_KEYS] >= 0:
        f = at(r, e.at[F_EXTRA_KEYS])
        if not read_nil(&f):
            if read_array(&f, &n) < 0 or n != n_hashes:
                return -1
            for k in range(n):
                if not read_nil(&f):
                    return -1
    return 0


cdef int count_uints(Reader* r, Py_ssize_t pos, bint tokens, Py_ssize_t* n) noexcept nogil:
    """How many items the array at `pos` holds, each checked as _wire_fast.pyx's `read_hashes`
    (`tokens`: `read_tokens`) reads it: 0, or -1 if one is not such an int."""
    cdef Reader f = at(r, pos)
    cdef Py_ssize_t k
    cdef uint64_t v
    if read_array(&f, n) < 0:
        return -1
    for k in range(n[0]):
        if read_uint64(&f, &v) < 0 or (tokens and v >> 32):
            return -1
    return 0


cdef int check_stored(Reader* r, Event* e, int64_t max_block_size,
                      StoredFields* s) noexcept nogil:
    """0 when the fields of BlockStored `e` but lora_name are as the slow path takes them, read
    into `s`; -1 if one is off."""
    cdef Reader f
    cdef Py_ssize_t span, pos
    if e.hashes_state == HELD:
        s.n_hashes = e.n_hashes
    elif e.hashes_state != UNREAD or count_uints(r, e.at[F_HASHES], False, &s.n_hashes) < 0:
        return -1
    if check_stored_extras(r, e, s.n_hashes) < 0:
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
    s.block_size = 0
    pos = e.at[F_BLOCK_SIZE]
    if pos >= 0:
        if pos < r.end and r.p[pos] <= 0x7F:  # a positive fixint, as senders write a size
            s.block_size = r.p[pos]
        else:
            f = at(r, pos)
            if read_int64(&f, &s.block_size) < 0:
                return -1
        if not 0 <= s.block_size <= max_block_size:
            return -1
    s.n_tokens = 0
    if e.at[F_TOKENS] >= 0:
        if e.tokens_state == HELD:
            s.n_tokens = e.n_tokens
        elif e.tokens_state != UNREAD or count_uints(r, e.at[F_TOKENS], True, &s.n_tokens) < 0:
            return -1
    # As many token ids as the blocks hold: none, block_size per hash, or whole blocks more
    # (wire_rules.token_ids_of).
    span = s.block_size * s.n_hashes
    if s.n_tokens and s.n_tokens != span and not (
        s.block_size and s.n_tokens % s.block_size == 0 and s.n_tokens > span
    ):
        return -1
    if e.at[F_CACHE_SALT] >= 0:
        f = at(r, e.at[F_CACHE_SALT])
        if not read_nil(&f):
            return -1  # SGLang's salt joins the extra keys: the slow path's work
    return 0
