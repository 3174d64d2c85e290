# cython: language_level=3, boundscheck=False, wraparound=False
"""The DP rank a fleet's batch names, by a scan of its msgpack bytes (collector/fleet.py's
`batch_rank` tries this first, for every message of a fleet).

msgspec's decoders build a struct and two `Raw`s to read one int; this steps over the ts and
the events with collector/_msgpack.pxd's `skip` (msgspec's own skip, checked against the
payload's end) and reads the rank. It reads only the shape vLLM sends, `[ts, events]` or
`[ts, events, rank-or-nil]` with nothing after it; anything else (a map, more or fewer items,
a rank that is not an int in int64's range, nesting past `skip`'s depth, trailing bytes)
returns -1, and the caller asks msgspec, which alone decides what such a payload names.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t

from kvscope.collector._msgpack cimport Reader, read_array, read_int64, read_nil, skip


def scan_rank(bytes payload, int64_t max_rank):
    """The rank in [0, max_rank) the batch names, 0 for nil, none or one outside it; -1 when
    the scan cannot tell (the caller decodes the slow way)."""
    cdef Reader r
    cdef Py_ssize_t n
    cdef int64_t rank = 0
    r.p = <const uint8_t*>PyBytes_AS_STRING(payload)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(payload)
    if read_array(&r, &n) < 0 or n < 2 or n > 3:
        return -1
    if skip(&r, 1) < 0 or skip(&r, 1) < 0:
        return -1
    if n == 3 and not read_nil(&r):
        if read_int64(&r, &rank) < 0:
            return -1
        if rank < 0 or rank >= max_rank:
            rank = 0
    if r.pos != r.end:
        return -1
    return rank
