# A stream dictionary's granules (storage/log_dictionary.py: runs of `GRANULE_IDS` token ids as
# msgpack lays them out, one after another), found by their bytes: format 4 of the log's chunks
# (storage/_log_columns.pyx) stores each whole granule of a token run that the dictionary holds
# as its number there, a varint, where zstd would spend a match of several bytes on it. A number
# is only ever given for bytes found equal, so any dictionary gives every payload back. All
# inline but the index itself (storage/_granules.pyx): they run without the GIL.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from kvscope.storage._log_buf cimport Buf, get_varint, grow_nogil, put_nogil, put_varint_nogil
from kvscope.storage._msgpack_widths cimport kvscope_id_width


cdef enum:
    GRANULE_IDS = 16  # storage/log_dictionary.py's GRANULE


cdef struct Granules:
    const uint8_t* p  # the dictionary's content
    Py_ssize_t* starts  # each granule's start, and the end of the last
    Py_ssize_t n
    uint64_t* keys
    uint32_t* slots  # open addressing: a granule's number + 1 (0: empty)
    uint64_t mask


cdef class GranuleIndex:
    cdef bytes content
    cdef Granules g
    cdef Py_ssize_t starts_held  # entries allocated at `g.starts`


cdef inline int id_width(uint8_t b) noexcept nogil:
    """Bytes of a msgpack int of at most 4 bytes whose first byte is `b`, else 0."""
    return kvscope_id_width[b]


cdef inline Py_ssize_t ids_bytes(const uint8_t* p, Py_ssize_t end, Py_ssize_t count) noexcept nogil:
    """Bytes of `count` such ints from `p` (`end` bytes there), else -1."""
    cdef Py_ssize_t pos = 0, k = 0
    cdef int w
    if end >= 5 * count:  # room for the widest ids: no bound to check per id
        for k in range(count):
            w = id_width(p[pos])
            if w == 0:
                return -1
            pos += w
        return pos
    while k < count and end - pos >= 5:  # room for the widest id: one test, not two
        w = id_width(p[pos])
        if w == 0:
            return -1
        pos += w
        k += 1
    while k < count:
        if pos >= end:
            return -1
        w = id_width(p[pos])
        if w == 0 or w > end - pos:
            return -1
        pos += w
        k += 1
    return pos


cdef inline uint64_t granule_key(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """A hash of `p[:n]`, a word at a time (a granule is at least as long as its ids)."""
    cdef uint64_t h = <uint64_t>n * <uint64_t>0x9E3779B97F4A7C15, w
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        h = (h ^ w) * <uint64_t>0xFF51AFD7ED558CCD
        h ^= h >> 29
        i += 8
    w = 0
    memcpy(&w, p + i, n - i)
    h = (h ^ w) * <uint64_t>0xC4CEB9FE1A85EC53
    return h ^ (h >> 32)


cdef inline Py_ssize_t granule_find(const Granules* g, const uint8_t* p, Py_ssize_t n,
                                    uint64_t key) noexcept nogil:
    """The number of the granule whose bytes are `p[:n]` (`key` theirs), else -1."""
    cdef uint64_t slot
    cdef Py_ssize_t i
    if g.n == 0:
        return -1
    slot = ((key * <uint64_t>0x9E3779B97F4A7C15) >> 20) & g.mask
    while g.slots[slot]:
        i = g.slots[slot] - 1
        if (g.keys[slot] == key and g.starts[i + 1] - g.starts[i] == n
                and memcmp(g.p + g.starts[i], p, n) == 0):
            return i
        slot = (slot + 1) & g.mask
    return -1


cdef inline int granules_put(const Granules* g, const uint8_t* p, Py_ssize_t n,
                             Py_ssize_t items, Buf* toks, Buf* grefs) noexcept nogil:
    """A token run of `items` ids (`n` bytes, read whole already): each whole granule as its
    number + 1 in `grefs` if the dictionary holds it, else 0 there and its bytes in `toks`; the
    ids after the last whole granule in `toks`. -1 if memory ran out."""
    cdef Py_ssize_t pos = 0, k, w, i
    if g.n == 0:
        # An empty index (a chunk without a dictionary) holds none: each granule's 0, and
        # every id's bytes as they lie, in one go.
        if grow_nogil(grefs, items // GRANULE_IDS) < 0:
            return -1
        memset(grefs.p + grefs.n, 0, items // GRANULE_IDS)
        grefs.n += items // GRANULE_IDS
        return put_nogil(toks, p, n)
    for k in range(items // GRANULE_IDS):
        w = ids_bytes(p + pos, n - pos, GRANULE_IDS)
        i = granule_find(g, p + pos, w, granule_key(p + pos, w))
        if put_varint_nogil(grefs, <uint64_t>(i + 1)) < 0:
            return -1
        if i < 0 and put_nogil(toks, p + pos, w) < 0:
            return -1
        pos += w
    return put_nogil(toks, p + pos, n - pos)


cdef inline int granules_join(const Granules* g, Py_ssize_t items, const uint8_t* toks,
                              Py_ssize_t* tp, Py_ssize_t te, const uint8_t* grefs,
                              Py_ssize_t* gp, Py_ssize_t ge, Buf* out) noexcept nogil:
    """The token run `granules_put` split, back into `out`: 0, -1 if the columns do not hold
    it, -2 if memory ran out."""
    cdef Py_ssize_t k, w
    cdef uint64_t r
    if g.n == 0:
        # An empty index: each granule's number must be 0, and the run's ids lie in `toks`
        # as they came, read and put in one go.
        for k in range(items // GRANULE_IDS):
            if get_varint(grefs, gp, ge, &r) < 0 or r != 0:
                return -1
        w = ids_bytes(toks + tp[0], te - tp[0], items)
        if w < 0:
            return -1
        if put_nogil(out, toks + tp[0], w) < 0:
            return -2
        tp[0] += w
        return 0
    for k in range(items // GRANULE_IDS + 1):
        if k == items // GRANULE_IDS:
            r = 0
            w = ids_bytes(toks + tp[0], te - tp[0], items % GRANULE_IDS)
        else:
            if get_varint(grefs, gp, ge, &r) < 0:
                return -1
            w = ids_bytes(toks + tp[0], te - tp[0], GRANULE_IDS) if r == 0 else 0
        if w < 0 or r > <uint64_t>g.n:
            return -1
        if r:
            if put_nogil(out, g.p + g.starts[r - 1], g.starts[r] - g.starts[r - 1]) < 0:
                return -2
        else:
            if put_nogil(out, toks + tp[0], w) < 0:
                return -2
            tp[0] += w
    return 0
