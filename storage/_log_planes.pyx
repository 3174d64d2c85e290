# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Byte planes of the log chunks' columns (storage/log_columns.py): the batches' stamps, and
# format 5's token column without a dictionary, and back. Laying the token ids out lets the GIL
# go: the writer thread does it beside the ingest thread.
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memset
from cpython.bytes cimport PyBytes_FromStringAndSize


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


cdef Py_ssize_t plane_count(const uint8_t* p, Py_ssize_t n, Py_ssize_t* width) noexcept nogil:
    """The ids in `p`, and their planes' width; -1 where one is not an unsigned int of at most
    3 bytes in msgpack's shortest form."""
    cdef Py_ssize_t pos = 0, count = 0
    cdef uint64_t top = 0
    cdef uint8_t b
    while pos < n:
        b = p[pos]
        if b < 0x80:
            pos += 1
        elif b == 0xCC and n - pos >= 2 and p[pos + 1] >= 0x80:
            pos += 2
        elif b == 0xCD and n - pos >= 3 and p[pos + 1] != 0:
            pos += 3
        elif b == 0xCE and n - pos >= 5 and p[pos + 1] == 0 and p[pos + 2] != 0:
            pos += 5
            top = 2
        else:
            return -1
        if b == 0xCD and top < 1:
            top = 1
        count += 1
    width[0] = top + 1
    return count


cdef void put_planes(const uint8_t* p, Py_ssize_t count, Py_ssize_t width, uint8_t* lo,
                     uint8_t* hi) noexcept nogil:
    cdef Py_ssize_t pos = 0, i
    cdef uint64_t v
    cdef uint8_t b
    hi[0] = <uint8_t>width
    for i in range(count):
        b = p[pos]
        if b < 0x80:
            v = b
            pos += 1
        elif b == 0xCC:
            v = p[pos + 1]
            pos += 2
        elif b == 0xCD:
            v = (<uint64_t>p[pos + 1] << 8) | p[pos + 2]
            pos += 3
        else:
            v = (<uint64_t>p[pos + 2] << 16) | (<uint64_t>p[pos + 3] << 8) | p[pos + 4]
            pos += 5
        lo[i] = v & 0xFF
        if width > 1:
            hi[1 + i] = (v >> 8) & 0xFF
        if width > 2:
            hi[1 + count + i] = (v >> 16) & 0xFF


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
