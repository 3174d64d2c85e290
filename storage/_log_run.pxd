# One chunk's packing (storage/_log_columns.pyx): its payloads (a `Run`) split into columns made
# at their rooms (storage/_log_rooms.pxd), checked to join back (else all kept verbatim) where one
# took a path other than the split's plain ones, and its token ids laid out as format 5's planes
# where they fit. All but opening and closing a run runs
# without the GIL, so that a transaction's chunks are packed letting it go once.
from libc.stdint cimport uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from kvscope.storage._log_buf cimport Buf, fit_nogil, grow_nogil
from kvscope.storage._log_fold cimport Fold
from kvscope.storage._log_rooms cimport rooms_made
from kvscope.storage._log_split cimport Hashes, hashes_free, hashes_init
from kvscope.storage._log_join cimport same_back
from kvscope.storage._log_walk cimport split_all
from kvscope.storage._granules cimport GranuleIndex, Granules
from kvscope.storage._token_planes cimport planes_at_once


cdef struct Run:
    # One chunk's payloads (held by the caller meanwhile) and what the packing makes of them.
    const uint8_t** ptrs
    Py_ssize_t* lens
    Py_ssize_t count
    Py_ssize_t total  # the payloads' bytes
    const Granules* g
    Hashes h
    Buf cols[7]  # sizes, skeleton, references, literals, floats, tokens, granules' numbers
    Py_ssize_t rooms[7]  # the room made for each (storage/_log_rooms.pxd)
    Py_ssize_t wrote[7]  # each one's bytes once split (the token ids' before the planes)
    Py_ssize_t outgrown  # columns grown past their rooms
    Py_ssize_t kept
    Py_ssize_t odd  # payloads read by a path other than the split's plain ones
    bint checked  # whether the columns were joined back and compared
    bint planes  # format 5: the token ids as byte planes where they fit
    Py_ssize_t plane_ids  # -1: they do not fit
    Buf rest  # the upper planes (the low one takes the tokens' place)
    Fold fold  # the note job its first split notes for (storage/_log_fold.pxd; `job` NULL: none)


cdef inline int run_open(Run* r, tuple payloads, GranuleIndex granules) except -1:
    """`r` (zeroed) set to split `payloads`, which the caller holds until `run_close`."""
    cdef Py_ssize_t k
    cdef bytes payload
    r.count = len(payloads)
    r.g = NULL if granules is None else &granules.g
    r.plane_ids = -1
    r.ptrs = <const uint8_t**>malloc((r.count + 1) * sizeof(uint8_t*))
    r.lens = <Py_ssize_t*>malloc((r.count + 1) * sizeof(Py_ssize_t))
    if r.ptrs == NULL or r.lens == NULL:
        raise MemoryError()
    for k in range(r.count):
        payload = payloads[k]
        r.ptrs[k] = <const uint8_t*>payload
        r.lens[k] = len(payload)
        r.total += r.lens[k]
    return 0


cdef inline int run_scratch(Run* r) noexcept nogil:
    """The split's hash table, made when the run's walk begins (not when it is opened: a
    transaction's runs are all opened first); -1 if memory ran out."""
    return hashes_init(&r.h, r.total // 9)


cdef inline void run_close(Run* r) noexcept:
    cdef int i
    hashes_free(&r.h)
    for i in range(7):
        free(r.cols[i].p)
    free(r.rest.p)
    free(r.ptrs)
    free(r.lens)


cdef inline void run_outgrown(Run* r) noexcept nogil:
    """Counts the columns that outgrew their rooms (before they are cut to fit)."""
    cdef int i
    for i in range(7):
        r.outgrown += r.cols[i].cap > r.rooms[i]


cdef inline int run_split(Run* r, bint verbatim, const Py_ssize_t* shares) noexcept nogil:
    """The payloads into the columns, from empty ones made at `shares` of their bytes (all
    verbatim if `verbatim`, which leaves the hash table alone); -1 if memory ran out."""
    cdef Buf* bufs[6]
    cdef int i
    if rooms_made(r.cols, r.rooms, r.count, r.total, -1 if r.g == NULL else r.g.n, shares) < 0:
        return -1
    for i in range(6):
        bufs[i] = &r.cols[i + 1]
    r.kept = 0
    r.odd = 0
    return split_all(r.ptrs, r.lens, r.count, verbatim, &r.cols[0], bufs, &r.h, &r.kept,
                     &r.odd, r.g, NULL if r.fold.job == NULL else &r.fold)


cdef inline int run_columns(Run* r, const Py_ssize_t* shares) noexcept nogil:
    """`run_pack`'s work, its hash table made."""
    cdef const uint8_t* cols[7]
    cdef Py_ssize_t lens[7]
    cdef Py_ssize_t width = 0, n
    cdef uint8_t* planes
    cdef int i, same
    if run_split(r, False, shares) < 0:
        return -1
    # The plain paths give their payloads back by their making (tests/test_log_plain_paths.py
    # holds them to it, whatever the bytes): a chunk read by them alone is not joined back. One
    # that took any other, or kept a payload verbatim (its columns taken back), is.
    same = 1
    r.checked = r.odd != 0 or r.kept != 0
    if r.checked:
        for i in range(7):
            cols[i] = <const uint8_t*>b""  # an empty column's, never NULL
            if r.cols[i].p != NULL:
                cols[i] = r.cols[i].p
            lens[i] = r.cols[i].n
        same = 0 if r.count > lens[0] + 1 else same_back(r.count, cols, lens, r.g, r.ptrs, r.lens)
    if same < 0 or (same == 0 and run_split(r, True, shares) < 0):
        return -1
    for i in range(7):
        r.wrote[i] = r.cols[i].n
    if not r.planes:
        return 0
    # The planes made in one walk, into scratch: the tokens stay as they are where an id
    # does not fit (format 4's then).
    n = r.cols[5].n
    planes = <uint8_t*>malloc(3 * n + 1)
    if planes == NULL:
        return -1
    r.plane_ids = planes_at_once(r.cols[5].p, n, planes, planes + n, planes + 2 * n, &width)
    if r.plane_ids >= 0 and grow_nogil(&r.rest, 1 + (width - 1) * r.plane_ids) < 0:
        free(planes)
        return -1
    if r.plane_ids > 0:
        # The low plane takes the tokens' place; the others follow the width in `rest`.
        memcpy(r.cols[5].p, planes, r.plane_ids)
        memcpy(r.rest.p + 1, planes + n, (width > 1) * r.plane_ids)
        memcpy(r.rest.p + 1 + r.plane_ids, planes + 2 * n, (width > 2) * r.plane_ids)
    if r.plane_ids >= 0:
        r.rest.p[0] = <uint8_t>width
        r.cols[5].n = r.plane_ids
        r.rest.n = 1 + (width - 1) * r.plane_ids
    free(planes)
    return 0


cdef inline int run_pack(Run* r, const Py_ssize_t* shares) noexcept nogil:
    """`log_columns.columns`' work on one chunk: the split, its check that the columns give
    the payloads back (else all verbatim) and format 5's planes; -1 if memory ran out. Its
    scratch (the hash table, the payloads' pointers, the columns' unused room) goes before it
    returns: a transaction's chunks are packed in one go, and kept until the end, each
    chunk's would add up."""
    cdef int failed = run_scratch(r), i
    if failed == 0:
        failed = run_columns(r, shares)
    hashes_free(&r.h)
    free(r.ptrs)
    free(r.lens)
    r.ptrs = NULL
    r.lens = NULL
    run_outgrown(r)
    for i in range(7):
        fit_nogil(&r.cols[i])
    return failed
