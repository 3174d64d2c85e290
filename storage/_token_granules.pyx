# The token ids a batch carries, cut into runs of `granule` ids as they lie in its msgpack bytes,
# and noted in a stream's content (storage/log_dictionary.py): every array of at least `granule`
# ints that fit 32 bits (token ids; hashes are 64-bit) is cut, each other value walked into or
# stepped over, so vLLM's map and array layouts alike are read. What it cannot read is left
# out: the content only makes the log smaller, never different. In C, since the writer thread
# holds the GIL meanwhile, and the ingest thread waits for it.
from libc.stdint cimport uint8_t, uint64_t
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Contains

from kvscope.collector._msgpack cimport MAX_DEPTH, Reader, read_array, read_map, read_uint64, skip


cdef bint all_tokens(Reader* r, Py_ssize_t n) noexcept nogil:
    """Whether the array's `n` items are ints that fit 32 bits (the reader is moved on)."""
    cdef uint64_t v
    cdef Py_ssize_t k
    for k in range(n):
        if read_uint64(r, &v) < 0 or v >> 32:
            return False
    return True


cdef int note_runs(Reader* r, Py_ssize_t n, Py_ssize_t granule, dict seen, object when,
                   Py_ssize_t* counts) except -1:
    cdef uint64_t v
    cdef Py_ssize_t k, cut = r.pos
    cdef bytes run
    for k in range(n):
        read_uint64(r, &v)  # read once already: cannot fail
        if (k + 1) % granule == 0:
            run = PyBytes_FromStringAndSize(<const char*>r.p + cut, r.pos - cut)
            counts[PyDict_Contains(seen, run)] += r.pos - cut
            seen[run] = when  # a value replaced: the dict keeps its order and size
            cut = r.pos
    return 0


cdef int walk(Reader* r, int depth, Py_ssize_t granule, dict seen, object when,
              Py_ssize_t* counts) except -2:
    cdef Py_ssize_t n, k, start
    cdef uint8_t b
    if depth > MAX_DEPTH or r.pos >= r.end:
        return -1
    b = r.p[r.pos]
    if (0x90 <= b <= 0x9F) or b == 0xDC or b == 0xDD:
        if read_array(r, &n) < 0:
            return -1
        start = r.pos
        if n >= granule and all_tokens(r, n):
            r.pos = start
            return note_runs(r, n, granule, seen, when, counts)
        r.pos = start
        for k in range(n):
            if walk(r, depth + 1, granule, seen, when, counts) < 0:
                return -1
        return 0
    if (0x80 <= b <= 0x8F) or b == 0xDE or b == 0xDF:
        if read_map(r, &n) < 0:
            return -1
        for k in range(2 * n):
            if walk(r, depth + 1, granule, seen, when, counts) < 0:
                return -1
        return 0
    return skip(r, depth)


def note_token_runs(bytes payload, Py_ssize_t granule, dict seen, object when) -> tuple[int, int]:
    """Note in `seen` (run -> when last seen) the payload's runs of `granule` token ids (the
    ints' msgpack encodings, no array header; a run shorter than `granule` is left out) as seen
    `when`: (bytes of runs new to it, bytes of runs it held already)."""
    cdef Reader r
    cdef Py_ssize_t counts[2]
    if granule < 1:
        raise ValueError("granule must be at least 1")
    r.p = <const uint8_t*>payload
    r.pos = 0
    r.end = len(payload)
    counts[0] = counts[1] = 0
    walk(&r, 0, granule, seen, when, counts)
    return counts[0], counts[1]
