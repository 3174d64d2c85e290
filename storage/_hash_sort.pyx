# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# A checkpoint's hashes sorted: the list format 6 of the log's chunks names a hash's position in
# (storage/_log_known.pyx, storage/log_known.py), which a writer and every reader make alike
# from one map, however its tables lay their hashes out.
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize

from kvscope.collector._radix_sort cimport radix_sort


cdef enum:
    # Lists at least this long are spread into buckets by their top bits before sorting:
    # hashes spread evenly, so a bucket holds a few, sorted in place; shorter ones take the
    # radix sort.
    SPREAD_LIST = 4096
    # A bucket past this many values is radix-sorted rather than sorted by insertion.
    SMALL_BUCKET = 48

SPREAD_FROM = SPREAD_LIST


cdef inline void insertion_sort(uint64_t* v, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef uint64_t x
    for i in range(1, n):
        x = v[i]
        j = i
        while j and v[j - 1] > x:
            v[j] = v[j - 1]
            j -= 1
        v[j] = x


cdef uint64_t* spread_sort(uint64_t* values, Py_ssize_t n) noexcept nogil:
    """`values` ascending, in a new buffer (the caller frees it), NULL if memory ran out: one
    pass spreads them into about n/2 buckets by their top bits, then each bucket is sorted
    alone. A radix sort's eight passes over every value cost several times as much for hashes,
    which spread evenly; a bucket that takes many (values sharing their top bits) gets the
    radix sort."""
    cdef int bits = 8
    while bits < 16 and (<Py_ssize_t>1 << (bits + 2)) <= n:
        bits += 1
    cdef int shift = 64 - bits
    cdef Py_ssize_t buckets = <Py_ssize_t>1 << bits, i, b, start, size, total = 0, c
    cdef uint64_t* out = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc((buckets + 1) * sizeof(Py_ssize_t))
    if out == NULL or starts == NULL:
        free(out)
        free(starts)
        return NULL
    memset(starts, 0, (buckets + 1) * sizeof(Py_ssize_t))
    for i in range(n):
        starts[values[i] >> shift] += 1
    for b in range(buckets):
        c = starts[b]
        starts[b] = total
        total += c
    starts[buckets] = total
    for i in range(n):  # each bucket's next free place: its start moves up to the next's
        b = <Py_ssize_t>(values[i] >> shift)
        out[starts[b]] = values[i]
        starts[b] += 1
    start = 0
    for b in range(buckets):  # starts[b] is now bucket b's end
        size = starts[b] - start
        if size > SMALL_BUCKET:
            if radix_sort(out + start, size) < 0:
                free(out)
                free(starts)
                return NULL
        elif size > 1:
            insertion_sort(out + start, size)
        start = starts[b]
    free(starts)
    return out


def sorted_hashes(list arrays):
    """The distinct values of `arrays` (buffers of native uint64), ascending, as the 8 bytes
    msgpack holds each (big-endian): a list a writer and a reader make alike from one map,
    however its tables lay their hashes out."""
    cdef Py_ssize_t total = 0, n = 0, i, k, distinct = 0
    cdef int failed
    cdef uint64_t* spread
    cdef const uint8_t[:] view
    for a in arrays:
        total += len(memoryview(a).cast("B")) // 8
    cdef uint64_t* values = <uint64_t*>malloc((total + 1) * sizeof(uint64_t))
    if values == NULL:
        raise MemoryError()
    try:
        for a in arrays:
            view = memoryview(a).cast("B")
            k = view.shape[0] // 8
            if k:
                memcpy(values + n, &view[0], 8 * k)
            n += k
        with nogil:
            if n >= SPREAD_LIST:
                spread = spread_sort(values, n)
                failed = spread == NULL
                if not failed:
                    free(values)
                    values = spread
            else:
                failed = radix_sort(values, n)
        if failed:
            raise MemoryError()
        out = PyBytes_FromStringAndSize(NULL, 8 * n)
        dst = <uint8_t*><char*>out
        for i in range(n):
            if distinct and values[i] == values[i - 1]:
                continue
            for k in range(8):
                dst[8 * distinct + k] = <uint8_t>(values[i] >> (56 - 8 * k))
            distinct += 1
        return out[: 8 * distinct]
    finally:
        free(values)
