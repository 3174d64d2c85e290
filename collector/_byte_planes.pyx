# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A column of fixed-width numbers as byte planes (every item's byte 0, then every byte 1, ...)
and back: snapshots store their columns so, since zstd finds the runs of equal high bytes
(small slots, token ids under 2^17) that interleaved items hide from it."""

import array

from cpython cimport array as carray
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy


def split_planes(const unsigned char[::1] data, Py_ssize_t width):
    """`data` (items of `width` bytes) as its `width` byte planes, one after another."""
    _check(data.shape[0], width)
    out = PyBytes_FromStringAndSize(NULL, data.shape[0])
    _transpose(&data[0] if data.shape[0] else NULL, <unsigned char*>PyBytes_AS_STRING(out),
               data.shape[0], width, True)
    return out


def join_planes(const unsigned char[::1] data, Py_ssize_t width, str typecode=None):
    """The inverse of `split_planes`: bytes, or with `typecode` an array of that type (made
    once, for a table to keep as its column)."""
    cdef Py_ssize_t size = data.shape[0]
    _check(size, width)
    cdef unsigned char* dst
    if typecode is None:
        out = PyBytes_FromStringAndSize(NULL, size)
        dst = <unsigned char*>PyBytes_AS_STRING(out)
    else:
        out = array.array(typecode)
        if size % out.itemsize:
            raise ValueError(f"{size} bytes are not items of {typecode!r}")
        out = carray.clone(out, size // out.itemsize, False)
        dst = (<carray.array>out).data.as_uchars
    _transpose(&data[0] if size else NULL, dst, size, width, False)
    return out


cdef int _check(Py_ssize_t size, Py_ssize_t width) except -1:
    if width < 1 or size % width:
        raise ValueError(f"{size} bytes are not items of {width} bytes")
    return 0


cdef void _transpose(
    const unsigned char* src, unsigned char* dst, Py_ssize_t size, Py_ssize_t width, bint split
) noexcept nogil:
    cdef Py_ssize_t n = size // width, i, p
    if size == 0:
        return
    if width == 1:
        memcpy(dst, src, size)
    elif not split and width == 4:
        _join4(src, dst, n)
    elif not split and width == 8:
        _join8(src, dst, n)
    elif split and width == 4:
        _split4(src, dst, n)
    elif split and width == 8:
        _split8(src, dst, n)
    elif split:
        for p in range(width):
            for i in range(n):
                dst[p * n + i] = src[i * width + p]
    else:
        for i in range(n):
            for p in range(width):
                dst[i * width + p] = src[p * n + i]


# Joining is what a rebuild waits for, splitting what a reset's `before` map and each checkpoint
# cost the writer. The common widths, as constants, let the compiler unroll an item's bytes and
# vectorize.
cdef inline void _join4(const unsigned char* s, unsigned char* d, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[4 * i] = s[i]
        d[4 * i + 1] = s[n + i]
        d[4 * i + 2] = s[2 * n + i]
        d[4 * i + 3] = s[3 * n + i]


cdef inline void _join8(const unsigned char* s, unsigned char* d, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, p
    for i in range(n):
        for p in range(8):
            d[8 * i + p] = s[p * n + i]


cdef inline void _split4(const unsigned char* s, unsigned char* d, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[i] = s[4 * i]
        d[n + i] = s[4 * i + 1]
        d[2 * n + i] = s[4 * i + 2]
        d[3 * n + i] = s[4 * i + 3]


cdef inline void _split8(const unsigned char* s, unsigned char* d, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, p
    for i in range(n):
        for p in range(8):
            d[p * n + i] = s[8 * i + p]
