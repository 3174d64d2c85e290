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
    F_LORA_ID,
    Event,
)

from kvscope.collector import wire_rules

# The rules' bounds, which the inline reads of _wire_checks.pxd hold as C constants.
if MAX_ABS_TS != wire_rules.MAX_ABS_TS or MAX_RANK != wire_rules.MAX_RANK:
    raise ImportError("_wire_checks.pxd's bounds differ from collector/wire_rules.py's")


cdef int stored_fixed(Reader* r, Event* e, int64_t* block_size,
                      Py_ssize_t* extra_keys) noexcept nogil:
    """The fields of a BlockStored that do not depend on its hashes and tokens: lora_id an int
    or nil, extra_keys nil or nils (`extra_keys`: how many, -1 when absent or nil: what the rules
    reduce to None; other extra keys are the slow path's), block_size an int >= 0 (-1 when
    absent; `stored_fit` bounds it), cache_salt nil. 0, or -1 if one is off."""
    cdef Reader f
    cdef Py_ssize_t n, k
    cdef int64_t i
    cdef uint64_t u
    cdef bint unsigned
    cdef Py_ssize_t pos
    if e.at[F_LORA_ID] >= 0:
        f = at(r, e.at[F_LORA_ID])
        if not read_nil(&f) and read_int(&f, &i, &u, &unsigned) < 0:
            return -1
    extra_keys[0] = -1
    if e.at[F_EXTRA_KEYS] >= 0:
        f = at(r, e.at[F_EXTRA_KEYS])
        if not read_nil(&f):
            if read_array(&f, &n) < 0:
                return -1
            for k in range(n):
                if not read_nil(&f):
                    return -1
            extra_keys[0] = n
    block_size[0] = -1
    pos = e.at[F_BLOCK_SIZE]
    if pos >= 0:
        if pos < r.end and r.p[pos] <= 0x7F:  # a positive fixint, as senders write a size
            block_size[0] = r.p[pos]
        else:
            f = at(r, pos)
            if read_int64(&f, block_size) < 0 or block_size[0] < 0:
                return -1
    if e.at[F_CACHE_SALT] >= 0:
        f = at(r, e.at[F_CACHE_SALT])
        if not read_nil(&f):
            return -1  # SGLang's salt joins the extra keys: the slow path's work
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
    cdef Py_ssize_t extra_keys
    if stored_counts(r, e, s) < 0 or stored_fixed(r, e, &s.block_size, &extra_keys) < 0:
        return -1
    return stored_fit(s, max_block_size, extra_keys)
