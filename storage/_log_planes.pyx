# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Byte planes of the log chunks' columns (storage/log_columns.py): the batches' stamps, and
# format 5's token column without a dictionary, and back. Laying the token ids out lets the GIL
# go: the writer thread does it beside the ingest thread.
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memset
from cpython.bytes cimport PyBytes_FromStringAndSize

from kvscope.storage._token_planes cimport plane_count, put_planes


def xor_planes(bytes data, bint inverse=False):
    """8-byte values as the XOR of each with the one before, laid out byte plane by byte plane
    (a column of close timestamps then compresses to a few planes); `inverse` undoes it."""
    cdef Py_ssize_t n = len(data) // 8, i, k
    cdef const uint8_t* src = data
    cdef uint8_t prev[8]
    if len(data) % 8:
        raise ValueError("xor_planes: not 8-byte values")
    cdef uint8_t* dst
    out = PyBytes_FromStringAndSize(NULL, len(data))
    dst = <uint8_t*><char*>out
    memset(prev, 0, 8)
    for i in range(n):
        for k in range(8):
            if inverse:
                prev[k] ^= src[k * n + i]
                dst[8 * i + k] = prev[k]
            else:
                dst[k * n + i] = src[8 * i + k] ^ prev[k]
                prev[k] = src[8 * i + k]
    return out


def token_planes(bytes toks):
    """Format 5's token column without a dictionary: (low bytes, rest), or None where the ids
    are not unsigned ints of at most 3 bytes, each in msgpack's shortest form (then only their
    own bytes give them back). The rest is the width, then each byte plane above the low one:
    an id's bytes stay apart, and each plane compresses by what its bytes are alone."""
    cdef const uint8_t* p = toks
    cdef Py_ssize_t n = len(toks), count, width = 0
    with nogil:
        count = plane_count(p, n, &width)
    if count < 0:
        return None
    low = PyBytes_FromStringAndSize(NULL, count)
    rest = PyBytes_FromStringAndSize(NULL, 1 + (width - 1) * count)
    cdef uint8_t* lo = <uint8_t*><char*>low
    cdef uint8_t* hi = <uint8_t*><char*>rest
    with nogil:
        put_planes(p, count, width, lo, hi)
    return low, rest


def tokens_of_planes(bytes low, bytes rest):
    """`token_planes`' column back; ValueError if the planes do not fit together."""
    cdef Py_ssize_t count = len(low), i
    cdef const uint8_t* lo = low
    cdef const uint8_t* hi = rest
    cdef Py_ssize_t width = hi[0] if len(rest) else 0
    cdef uint64_t v
    cdef uint8_t* o
    cdef Py_ssize_t n = 0
    if width < 1 or width > 3 or len(rest) != 1 + (width - 1) * count:
        raise ValueError("log columns: token planes do not fit together")
    out = PyBytes_FromStringAndSize(NULL, 5 * count)
    o = <uint8_t*><char*>out
    for i in range(count):
        v = lo[i]
        if width > 1:
            v |= <uint64_t>hi[1 + i] << 8
        if width > 2:
            v |= <uint64_t>hi[1 + count + i] << 16
        if v < 0x80:
            o[n] = <uint8_t>v
            n += 1
        elif v < 0x100:
            o[n] = 0xCC
            o[n + 1] = <uint8_t>v
            n += 2
        elif v < 0x10000:
            o[n] = 0xCD
            o[n + 1] = <uint8_t>(v >> 8)
            o[n + 2] = <uint8_t>v
            n += 3
        else:
            o[n] = 0xCE
            o[n + 1] = 0
            o[n + 2] = <uint8_t>(v >> 16)
            o[n + 3] = <uint8_t>(v >> 8)
            o[n + 4] = <uint8_t>v
            n += 5
    return out[:n]


def low_high(const double[::1] values):
    """(min(values), max(values)) of a chunk's times, read in C: `min` and `max` make a float
    object of each value, while the writer holds the GIL. Compared as they compare (a value
    replaces the lowest only if below it, the highest only if above it: NaN and -0.0 too)."""
    cdef Py_ssize_t n = values.shape[0], i
    cdef double lo, hi, v
    if n == 0:
        raise ValueError("low_high: no values")
    lo = hi = values[0]
    for i in range(1, n):
        v = values[i]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi
