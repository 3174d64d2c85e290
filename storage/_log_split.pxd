# The split's hash table for the log's columns (storage/_log_columns.pyx): finds a hash's
# earlier occurrence in a chunk. The split runs without the GIL (the ingest thread goes on
# meanwhile): each returns -1 when memory runs out, for the caller to raise once it holds the
# GIL again. All inline: they compile into the module that cimports
# them.
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset


cdef struct Hashes:
    uint64_t* values  # every occurrence, in order
    Py_ssize_t n
    Py_ssize_t cap
    uint64_t* keys  # open addressing: value -> its last occurrence + 1 (0: empty)
    Py_ssize_t* last
    uint64_t mask
    Py_ssize_t used  # slots taken; the table doubles before half of them are


cdef inline int hashes_init(Hashes* h, Py_ssize_t expected) noexcept nogil:
    """Room for `expected` occurrences; the table starts at a few distinct values per
    occurrence expected and grows as they come (a table the size of the occurrences would
    miss the cache at every lookup). -1 if memory ran out (`hashes_free` frees what was
    taken)."""
    cdef Py_ssize_t size = 1024
    while size < expected // 4:
        size <<= 1
    h.n = 0
    h.used = 0
    h.cap = expected + 16
    h.values = <uint64_t*>malloc(h.cap * sizeof(uint64_t))
    h.keys = <uint64_t*>malloc(size * sizeof(uint64_t))
    h.last = <Py_ssize_t*>malloc(size * sizeof(Py_ssize_t))
    h.mask = size - 1
    if h.values == NULL or h.keys == NULL or h.last == NULL:
        return -1
    memset(h.last, 0, size * sizeof(Py_ssize_t))
    return 0


cdef inline int hashes_grow(Hashes* h) noexcept nogil:
    """The table at twice its size, each value where it lands there (lookups find the same)."""
    cdef Py_ssize_t size = 2 * (h.mask + 1), i
    cdef uint64_t* keys = <uint64_t*>malloc(size * sizeof(uint64_t))
    cdef Py_ssize_t* last = <Py_ssize_t*>malloc(size * sizeof(Py_ssize_t))
    cdef uint64_t mask = size - 1
    cdef uint64_t slot
    if keys == NULL or last == NULL:
        free(keys)
        free(last)
        return -1
    memset(last, 0, size * sizeof(Py_ssize_t))
    for i in range(h.mask + 1):
        if h.last[i]:
            slot = ((h.keys[i] * <uint64_t>0x9E3779B97F4A7C15) >> 20) & mask
            while last[slot]:
                slot = (slot + 1) & mask
            keys[slot] = h.keys[i]
            last[slot] = h.last[i]
    free(h.keys)
    free(h.last)
    h.keys, h.last, h.mask = keys, last, mask
    return 0


cdef inline void hashes_free(Hashes* h) noexcept nogil:
    """Frees the table; again is harmless."""
    free(h.values)
    free(h.keys)
    free(h.last)
    h.values = NULL
    h.keys = NULL
    h.last = NULL


cdef inline Py_ssize_t hashes_note(Hashes* h, uint64_t v) noexcept nogil:
    """Notes `v`'s occurrence: how many occurrences back it was last seen (0: not seen)."""
    cdef uint64_t slot
    cdef Py_ssize_t back = 0, was
    cdef uint64_t* grown
    if 2 * (h.used + 1) > <Py_ssize_t>h.mask and hashes_grow(h) < 0:
        return -1
    slot = ((v * <uint64_t>0x9E3779B97F4A7C15) >> 20) & h.mask
    while h.last[slot] and h.keys[slot] != v:
        slot = (slot + 1) & h.mask
    if not h.last[slot]:
        h.used += 1
    was = h.last[slot] - 1
    # An entry left by a payload that was kept verbatim may name another value: check it.
    if h.last[slot] and was < h.n and h.values[was] == v:
        back = h.n - was
    if h.n == h.cap:
        grown = <uint64_t*>realloc(h.values, 2 * h.cap * sizeof(uint64_t))
        if grown == NULL:
            return -1
        h.values = grown
        h.cap *= 2
    h.values[h.n] = v
    h.n += 1
    h.keys[slot] = v
    h.last[slot] = h.n
    return back
