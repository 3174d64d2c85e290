# Rooms for a chunk's columns (storage/_log_columns.pyx): each column's buffer is made when the
# chunk's walk begins, at the chunk's payload bytes times the column's share of them in the
# chunks packed last, within the most the split can put there (`room_sizes`), and cut to fit
# when it ends. A column grown from empty was copied at each doubling (realloc), the larger part
# of the packing's copies; one that outgrows its room still grows so. A room is not the most a
# column can hold: that, told from the payloads alone, is several times what it holds, and rooms
# that large left the heap's free space strewn between the columns, where each chunk's scratch
# then took fresh pages (benchmarks/pack_rss.py measures the peak).
from libc.stdint cimport uint64_t

from kvscope.storage._log_buf cimport Buf, grow_nogil


cdef enum:
    COLUMNS = 7  # sizes, skeleton, references, literals, floats, tokens, granules' numbers


cdef inline Py_ssize_t varint_bytes(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline void room_sizes(Py_ssize_t count, Py_ssize_t total, Py_ssize_t granules,
                            Py_ssize_t* rooms) noexcept nogil:
    """The most each column of `count` payloads of `total` bytes can hold (`granules`: the
    dictionary's count of them, -1 without an index). A payload's bytes each go to one column
    but for an 8-byte int's or float's (9 bytes: its first byte to the skeleton, the rest to
    the literals or floats, and a reference back, no further than the chunk's count of them),
    and a token run's (its mark in the skeleton, in place of the array header's byte at least);
    a payload kept verbatim goes to the skeleton whole, what it had put elsewhere taken back."""
    cdef Py_ssize_t words = total // 9
    # A varint is put where 10 bytes are free (storage/_log_buf.pxd): 9 more than it may take.
    rooms[0] = count * varint_bytes(2 * <uint64_t>total + 1) + 9
    rooms[1] = total
    rooms[2] = words * varint_bytes(words) + 9
    rooms[3] = 8 * words
    rooms[4] = 8 * words
    rooms[5] = total
    # A granule's number (+ 1) for each 16 ids, of a byte at least each.
    rooms[6] = 0 if granules < 0 else (total // 16) * varint_bytes(granules + 1) + 9


cdef inline int rooms_made(Buf* cols, Py_ssize_t* rooms, Py_ssize_t count, Py_ssize_t total,
                           Py_ssize_t granules, const Py_ssize_t* shares) noexcept nogil:
    """Each column emptied, with its room: its share of the payloads' bytes (`shares`, in
    1024ths), within the most it can hold (`rooms`: each one's size, as made); -1 if memory
    ran out."""
    cdef int i
    room_sizes(count, total, granules, rooms)
    for i in range(COLUMNS):
        cols[i].n = 0
        if rooms[i] and grow_nogil(&cols[i], min(rooms[i], ((total * shares[i]) >> 10) + 64)) < 0:
            return -1
        rooms[i] = cols[i].cap
    return 0
