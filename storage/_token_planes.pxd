# Format 5's token ids as byte planes (storage/_log_planes.pyx), without the GIL: the count of
# ids that fit them and their width, and the planes laid out. All inline: they compile into the
# module that cimports them.
from libc.stdint cimport uint8_t, uint64_t


cdef inline Py_ssize_t plane_count(const uint8_t* p, Py_ssize_t n, Py_ssize_t* width) noexcept nogil:
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


cdef inline void put_planes(const uint8_t* p, Py_ssize_t count, Py_ssize_t width, uint8_t* lo,
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


cdef inline Py_ssize_t planes_at_once(const uint8_t* p, Py_ssize_t n, uint8_t* lo, uint8_t* mid,
                                      uint8_t* top, Py_ssize_t* width) noexcept nogil:
    """`plane_count` and `put_planes` in one walk: the ids in `p` (`n` bytes) as their low,
    middle and top planes (each with room for `n`), their count and width; -1 where one does
    not fit (`p` is only read: the planes go elsewhere until they are known whole)."""
    cdef Py_ssize_t pos = 0, count = 0
    cdef uint64_t high = 0
    cdef uint8_t b
    while pos < n:
        b = p[pos]
        if b < 0x80:
            lo[count] = b
            mid[count] = 0
            top[count] = 0
            pos += 1
        elif b == 0xCC and n - pos >= 2 and p[pos + 1] >= 0x80:
            lo[count] = p[pos + 1]
            mid[count] = 0
            top[count] = 0
            pos += 2
        elif b == 0xCD and n - pos >= 3 and p[pos + 1] != 0:
            lo[count] = p[pos + 2]
            mid[count] = p[pos + 1]
            top[count] = 0
            pos += 3
            if high < 1:
                high = 1
        elif b == 0xCE and n - pos >= 5 and p[pos + 1] == 0 and p[pos + 2] != 0:
            lo[count] = p[pos + 4]
            mid[count] = p[pos + 3]
            top[count] = p[pos + 2]
            pos += 5
            high = 2
        else:
            return -1
        count += 1
    width[0] = high + 1
    return count
