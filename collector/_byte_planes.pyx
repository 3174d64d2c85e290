# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A column of fixed-width numbers as byte planes (every item's byte 0, then every byte 1, ...)
and back: snapshots store their columns so, since zstd finds the runs of equal high bytes
(small slots, token ids under 2^17) that interleaved items hide from it."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize


def split_planes(const unsigned char[::1] data, Py_ssize_t width):
    """`data` (items of `width` bytes) as its `width` byte planes, one after another."""
    return _transpose(data, width, True)


def join_planes(const unsigned char[::1] data, Py_ssize_t width):
    """The inverse of `split_planes`."""
    return _transpose(data, width, False)


cdef bytes _transpose(const unsigned char[::1] data, Py_ssize_t width, bint split):
    cdef Py_ssize_t size = data.shape[0]
    if width < 1 or size % width:
        raise ValueError(f"{size} bytes are not items of {width} bytes")
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef unsigned char* dst = <unsigned char*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t n = size // width, i, p
    if size == 0:
        return out
    cdef const unsigned char* src = &data[0]
    with nogil:
        if split:
            for p in range(width):
                for i in range(n):
                    dst[p * n + i] = src[i * width + p]
        else:
            for i in range(n):
                for p in range(width):
                    dst[i * width + p] = src[p * n + i]
    return out
