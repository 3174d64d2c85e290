# The content's note (storage/_token_granules.pyx) read from the log's split (storage/_log_walk.pxd)
# so that a payload is walked once: the split keeps each whole granule of the token runs it finds
# in a noted payload, and tracks what the note's own walk would read differently (a value after
# the first, nesting near its depth, an id the split takes for a hash, a payload cut short);
# where it may, the note walks that payload itself. All inline: they compile into the modules
# that cimport them.
from libc.stdint cimport uint8_t

from kvscope.storage._log_buf cimport Buf, grow_nogil
from kvscope.storage._granules cimport GRANULE_IDS, ids_bytes
from kvscope.storage._msgpack_widths cimport kvscope_id_signed, kvscope_id_width


cdef enum:
    TRACK_DEPTH = 48  # below the note's MAX_DEPTH: deeper, the note walks the payload itself


cdef struct Gran:
    # A granule to note: its bytes in a payload (held by the caller meanwhile).
    const uint8_t* p
    Py_ssize_t n


cdef struct Folded:
    # A note job's payloads read in the split, by their number in the job: each one's
    # granules in `grans`, from byte `at` to `upto`; `upto` -1 where the note walks the payload
    # itself.
    Buf grans
    Py_ssize_t* at
    Py_ssize_t* upto


cdef struct Fold:
    # A run's share of a note job (`job` NULL: none): its payload k is the job's `first` + k,
    # noted where that is a multiple of `step` (the job's payload of that number over `step`).
    Folded* job
    Py_ssize_t first
    Py_ssize_t step


cdef struct Track:
    # A noted payload's walk as the note reads it (storage/_log_walk.pxd's `split_one` keeps
    # the counts in locals): per container open, when the one around it closes.
    Py_ssize_t marks[TRACK_DEPTH]
    bint odd  # the note may read it otherwise
    Buf* grans


cdef inline Py_ssize_t map_kids(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """Keys and values of the map whose header is `p`'s `n` bytes, 0 if it is none."""
    cdef uint8_t b = p[0]
    cdef Py_ssize_t v = 0
    cdef Py_ssize_t i
    if 0x80 <= b <= 0x8F:
        return 2 * (b & 0x0F)
    if (b == 0xDE and n == 3) or (b == 0xDF and n == 5):
        for i in range(1, n):
            v = (v << 8) | p[i]
        return 2 * v
    return 0


cdef inline bint any_negative(const uint8_t* p, Py_ssize_t count) noexcept nogil:
    """Whether one of the `count` ids at `p` (`ids_bytes` read them) is below zero."""
    cdef Py_ssize_t pos = 0, k
    cdef uint8_t b
    for k in range(count):
        b = p[pos]
        if b >= 0xE0 or (0xD0 <= b <= 0xD2 and p[pos + 1] & 0x80):
            return True
        pos += kvscope_id_width[b]
    return False


cdef inline Py_ssize_t ids_stepped(const uint8_t* p, Py_ssize_t pos, Py_ssize_t n,
                                   uint8_t* signed) noexcept nogil:
    """Where the `n` ids from `pos` end, -1 at a byte that starts none; `signed` marks one
    that may be below zero."""
    cdef Py_ssize_t k
    cdef uint8_t b
    cdef int w
    for k in range(n):
        b = p[pos]
        w = kvscope_id_width[b]
        if w == 0:
            return -1
        signed[0] |= kvscope_id_signed[b]
        pos += w
    return pos


cdef inline Py_ssize_t ids_noted(const uint8_t* p, Py_ssize_t end, Py_ssize_t count,
                                 Buf* grans) noexcept nogil:
    """`ids_bytes` of the `count` ids at `p`, each whole granule of them put in `grans` (a Gran
    each) where none is below zero (else the note reads them as no token run): their bytes, -1
    if they are no token run, -2 if memory ran out."""
    cdef Py_ssize_t pos = 0, cut = 0, j, whole = count // GRANULE_IDS
    cdef uint8_t signed = 0
    cdef Gran* out
    if end < 5 * count and ids_bytes(p, end, count) < 0:  # else no id can pass the end
        return -1
    if grow_nogil(grans, whole * <Py_ssize_t>sizeof(Gran)) < 0:
        return -2
    out = <Gran*>(grans.p + grans.n)
    for j in range(whole):
        pos = ids_stepped(p, pos, GRANULE_IDS, &signed)
        if pos < 0:
            return -1
        out[j].p = p + cut
        out[j].n = pos - cut
        cut = pos
    pos = ids_stepped(p, pos, count - whole * GRANULE_IDS, &signed)
    if pos < 0:
        return -1
    if not signed or not any_negative(p, count):
        grans.n += whole * <Py_ssize_t>sizeof(Gran)
    return pos
