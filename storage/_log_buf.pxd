# A growable byte buffer in C for the log's columns (storage/_log_columns.pyx), and the varints
# they count with. All inline: they compile into the module that cimports them.
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport realloc, free
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize


cdef struct Buf:
    uint8_t* p
    Py_ssize_t n
    Py_ssize_t cap


cdef inline int grow_nogil(Buf* b, Py_ssize_t extra) noexcept nogil:
    """Room for `extra` more bytes; -1 if memory ran out (the writes below without the GIL
    return it too, for their caller to raise once it holds the GIL again)."""
    cdef Py_ssize_t cap
    cdef uint8_t* q
    if b.n + extra <= b.cap:
        return 0
    cap = max(2 * b.cap, b.n + extra, 256)
    q = <uint8_t*>realloc(b.p, cap)
    if q == NULL:
        return -1
    b.p = q
    b.cap = cap
    return 0


cdef inline void fit_nogil(Buf* b) noexcept nogil:
    """The room past what `b` holds given back (a buffer kept a while after it is written,
    whose doublings left up to half of it unused); as it was if that fails."""
    cdef uint8_t* q
    if b.p == NULL or b.n == b.cap or b.n == 0:
        return
    q = <uint8_t*>realloc(b.p, b.n)
    if q != NULL:
        b.p = q
        b.cap = b.n


cdef inline int put_nogil(Buf* b, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    if b.n + n > b.cap and grow_nogil(b, n) < 0:
        return -1
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef inline int put_varint_nogil(Buf* b, uint64_t v) noexcept nogil:
    if b.n + 10 > b.cap and grow_nogil(b, 10) < 0:
        return -1
    while v >= 0x80:
        b.p[b.n] = <uint8_t>((v & 0x7F) | 0x80)
        b.n += 1
        v >>= 7
    b.p[b.n] = <uint8_t>v
    b.n += 1
    return 0


cdef inline int reserve(Buf* b, Py_ssize_t extra) except -1:
    if grow_nogil(b, extra) < 0:
        raise MemoryError()
    return 0


cdef inline int put(Buf* b, const uint8_t* s, Py_ssize_t n) except -1:
    if put_nogil(b, s, n) < 0:
        raise MemoryError()
    return 0


cdef inline int put_varint(Buf* b, uint64_t v) except -1:
    if put_varint_nogil(b, v) < 0:
        raise MemoryError()
    return 0


cdef inline int get_varint(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t end,
                           uint64_t* out) noexcept nogil:
    cdef uint64_t v = 0
    cdef int shift = 0
    while pos[0] < end and shift < 64:
        v |= <uint64_t>(p[pos[0]] & 0x7F) << shift
        pos[0] += 1
        if not (p[pos[0] - 1] & 0x80):
            out[0] = v
            return 0
        shift += 7
    return -1


cdef inline bytes taken(Buf* b):
    if b.p == NULL:
        return b""
    out = PyBytes_FromStringAndSize(<char*>b.p, b.n)
    free(b.p)
    b.p = NULL
    b.n = b.cap = 0
    return out
