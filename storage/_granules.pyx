# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# A stream dictionary's granules found by their bytes (storage/_granules.pxd): made once per
# dictionary, read by format 4's split and join without the GIL.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memset


cdef class GranuleIndex:
    """The granules of a dictionary's `content`, from its start for as long as it reads as
    whole granules (a content made by storage/log_dictionary.py reads whole)."""

    def __cinit__(self, bytes content):
        cdef Granules* g = &self.g
        cdef Py_ssize_t end = len(content), pos = 0, w, size = 1024, i, n
        cdef uint64_t key, slot
        cdef Py_ssize_t* shrunk
        self.content = content
        g.p = <const uint8_t*>content
        self.starts_held = end // GRANULE_IDS + 2
        g.starts = <Py_ssize_t*>malloc(self.starts_held * sizeof(Py_ssize_t))
        if g.starts == NULL:
            raise MemoryError()
        g.starts[0] = 0
        g.n = 0
        while True:
            w = ids_bytes(g.p + pos, end - pos, GRANULE_IDS)
            if w <= 0:
                break
            pos += w
            g.n += 1
            g.starts[g.n] = pos
        # Room was made for the most granules the content's length could hold (one-byte ids):
        # give back what the granules found do not use.
        shrunk = <Py_ssize_t*>realloc(g.starts, (g.n + 1) * sizeof(Py_ssize_t))
        if shrunk != NULL:
            g.starts, self.starts_held = shrunk, g.n + 1
        while size < 2 * g.n:
            size <<= 1
        g.mask = size - 1
        g.keys = <uint64_t*>malloc(size * sizeof(uint64_t))
        g.slots = <uint32_t*>malloc(size * sizeof(uint32_t))
        if g.keys == NULL or g.slots == NULL:
            raise MemoryError()
        memset(g.slots, 0, size * sizeof(uint32_t))
        n, g.n = g.n, 0  # a granule held twice keeps its first number: found as it is added
        for i in range(n):
            w = g.starts[i + 1] - g.starts[i]
            key = granule_key(g.p + g.starts[i], w)
            g.n = i + 1
            if granule_find(g, g.p + g.starts[i], w, key) >= 0:
                continue
            slot = ((key * <uint64_t>0x9E3779B97F4A7C15) >> 20) & g.mask
            while g.slots[slot]:
                slot = (slot + 1) & g.mask
            g.keys[slot] = key
            g.slots[slot] = <uint32_t>(i + 1)
        g.n = n

    def __dealloc__(self):
        free(self.g.starts)
        free(self.g.keys)
        free(self.g.slots)

    def __len__(self):
        return self.g.n

    def __sizeof__(self):
        """With the arrays it holds (not the content: the dictionary's)."""
        return (object.__sizeof__(self) + self.starts_held * sizeof(Py_ssize_t)
                + (self.g.mask + 1) * (sizeof(uint64_t) + sizeof(uint32_t)))
