# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# A log dictionary's content (runs of token ids as msgpack ints, storage/log_dictionary.py) as
# uint32 records, for checkpoints to number their token blocks among (storage/checkpoint_blocks.py):
# in C, since a dictionary holds a quarter million ids and Python ints cost a hundred times more.
import array

from cpython cimport array as carray
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from kvscope.collector._msgpack cimport Reader, be16, be32, read_uint64

cdef carray.array _UINT32 = array.array("I")


def content_ids(const uint8_t[::1] content, Py_ssize_t granule):
    """The content's ids as array("I"), from its start for as long as it reads as whole runs of
    `granule` ids that fit 32 bits (a content this kvscope made reads whole)."""
    if granule < 1:
        raise ValueError("a granule of one id at least, please")
    cdef Reader r
    r.p = &content[0] if content.shape[0] else NULL
    r.pos = 0
    r.end = content.shape[0]
    # Each id takes one byte at least.
    out = carray.clone(_UINT32, content.shape[0], False)
    cdef uint32_t* ids = (<carray.array>out).data.as_uints
    cdef Py_ssize_t n = 0, whole = 0, left = granule
    cdef uint64_t v
    cdef const uint8_t* p = r.p
    cdef uint8_t b
    with nogil:
        while r.pos < r.end:
            # The forms a token id takes (a fixint, uint8/16/32) read here; any other, and one
            # cut short, by the reader's own read.
            b = p[r.pos]
            if b <= 0x7F:
                v = b
                r.pos += 1
            elif b == 0xCD and r.end - r.pos >= 3:
                v = be16(p + r.pos + 1)
                r.pos += 3
            elif b == 0xCE and r.end - r.pos >= 5:
                v = be32(p + r.pos + 1)
                r.pos += 5
            elif read_uint64(&r, &v) < 0 or v >> 32:
                break
            ids[n] = <uint32_t>v
            n += 1
            left -= 1
            if left == 0:
                whole, left = n, granule
    carray.resize(out, whole)
    return out
