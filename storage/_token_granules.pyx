# The token ids a batch carries, cut into runs of `granule` ids as they lie in its msgpack bytes:
# the content of the log's zstd dictionaries (storage/log_dictionary.py). Layout-free: every
# array of at least `granule` ints that fit 32 bits (token ids; hashes are 64-bit) is cut, each
# other value walked into or stepped over, so vLLM's map and array layouts alike are read. What
# it cannot read is left out: the dictionary only makes the log smaller, never different.
from libc.stdint cimport uint8_t, uint64_t

from kvscope.collector._msgpack cimport MAX_DEPTH, Reader, read_array, read_map, read_uint64, skip


cdef int walk(Reader* r, int depth, Py_ssize_t granule, list out) except -2:
    cdef Py_ssize_t n, k, start, cut
    cdef uint64_t v
    cdef uint8_t b
    if depth > MAX_DEPTH or r.pos >= r.end:
        return -1
    b = r.p[r.pos]
    if (0x90 <= b <= 0x9F) or b == 0xDC or b == 0xDD:
        if read_array(r, &n) < 0:
            return -1
        start = r.pos
        if n >= granule:
            cut = start
            for k in range(n):
                if read_uint64(r, &v) < 0 or v >> 32:
                    break
                if (k + 1) % granule == 0:
                    out.append(r.p[cut:r.pos])
                    cut = r.pos
            else:
                return 0
            del out[len(out) - k // granule:]  # not token ids after all
            r.pos = start
        for k in range(n):
            if walk(r, depth + 1, granule, out) < 0:
                return -1
        return 0
    if (0x80 <= b <= 0x8F) or b == 0xDE or b == 0xDF:
        if read_map(r, &n) < 0:
            return -1
        for k in range(2 * n):
            if walk(r, depth + 1, granule, out) < 0:
                return -1
        return 0
    return skip(r, depth)


def token_granules(bytes payload, Py_ssize_t granule, list out) -> None:
    """Append to `out` the payload's token ids, `granule` at a time, as bytes (the ints'
    msgpack encodings, no array header); a run shorter than `granule` is left out."""
    cdef Reader r
    if granule < 1:
        raise ValueError("granule must be at least 1")
    r.p = <const uint8_t*>payload
    r.pos = 0
    r.end = len(payload)
    walk(&r, 0, granule, out)
