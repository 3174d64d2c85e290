# A sort of 64-bit values in C: a radix sort, a byte a pass. qsort's call of a comparison per
# step took several times as long (a checkpoint's hashes, which a rebuild sorts; a before map's,
# which a reset's groups are numbered by). Inline: compiled into the module that cimports it.
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset


cdef inline int radix_sort(uint64_t* values, Py_ssize_t n) noexcept nogil:
    """`values` ascending: eight passes of a byte each, stable; -1 if memory ran out."""
    cdef uint64_t* other = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    cdef uint64_t* src = values
    cdef uint64_t* dst = other
    cdef uint64_t* swap
    cdef Py_ssize_t counts[256]
    cdef Py_ssize_t i, total, c
    cdef int shift, b
    if other == NULL:
        return -1
    for shift in range(0, 64, 8):
        memset(counts, 0, sizeof(counts))
        for i in range(n):
            counts[(src[i] >> shift) & 0xFF] += 1
        total = 0
        for b in range(256):
            c = counts[b]
            counts[b] = total
            total += c
        for i in range(n):
            b = <int>((src[i] >> shift) & 0xFF)
            dst[counts[b]] = src[i]
            counts[b] += 1
        swap = src
        src = dst
        dst = swap
    # Eight passes: the sorted values are back in `values`.
    free(other)
    return 0
