# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# The batch log's format 3 columns (storage/log_columns.py): a chunk's payloads split, byte for
# byte, into a skeleton and columns that compress apart. The split is a walk over msgpack's
# tokens in the order they lie (no nesting is tracked, so any layout is read the same way):
# 8-byte ints (hashes) go to a column of references to their earlier occurrence in the chunk
# or literals, 8-byte floats to a column of XORs with the float before, and an array's items,
# when all are ints of at most 4 bytes (token ids), to a token column kept as their msgpack
# bytes (what the stream's dictionary holds), the skeleton marking them with 0xC1 (a byte
# msgpack never uses). A payload the walk cannot read whole is kept verbatim. The join walks
# the skeleton the same way, so every byte comes back from where it went.
from libc.stdint cimport uint8_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcmp, memset
from cpython.bytes cimport PyBytes_FromStringAndSize

from kvscope.storage._log_buf cimport Buf, reserve, taken
from kvscope.storage._log_split cimport Hashes, hashes_free, hashes_init
from kvscope.storage._log_walk cimport join_all, split_all
from kvscope.storage._granules cimport GranuleIndex, Granules


cdef int gathered(tuple held, const uint8_t** cols, Py_ssize_t* lens, Buf* out) except -1:
    """`join`'s seven columns (`held`, which keeps them alive) as pointers and lengths, and
    room made in `out` for what they join into."""
    cdef bytes col
    cdef int k
    for k in range(7):
        col = held[k]
        if col is None:
            raise TypeError("log columns: a column is None, not bytes")
        cols[k] = <const uint8_t*>col
        lens[k] = len(col)
    reserve(out, 4 * lens[1] + lens[5] + lens[3] + lens[4])
    return 0


def split(list payloads, bint verbatim=False, GranuleIndex granules=None):
    """`payloads` as (sizes, skeleton, references, literals, floats, tokens), and the
    granules' numbers with `granules` (format 4), and the count kept verbatim; all verbatim if
    `verbatim`. The walk runs without the GIL (`payloads` holds the bytes meanwhile)."""
    cdef Buf sizes, skel, refs, lits, floats, toks, grefs
    cdef const Granules* g = NULL if granules is None else &granules.g
    cdef Hashes h
    cdef Py_ssize_t total = 0, kept = 0, count = len(payloads), k
    cdef bytes payload
    cdef Buf* all_bufs[6]
    cdef int i, failed
    cdef const uint8_t** ptrs = <const uint8_t**>malloc((count + 1) * sizeof(uint8_t*))
    cdef Py_ssize_t* lens = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    cdef tuple held = tuple(payloads)  # the bytes stay alive whatever becomes of the list
    memset(&sizes, 0, sizeof(Buf))
    memset(&skel, 0, sizeof(Buf))
    memset(&refs, 0, sizeof(Buf))
    memset(&lits, 0, sizeof(Buf))
    memset(&floats, 0, sizeof(Buf))
    memset(&toks, 0, sizeof(Buf))
    memset(&grefs, 0, sizeof(Buf))
    memset(&h, 0, sizeof(Hashes))
    all_bufs[0] = &skel
    all_bufs[1] = &refs
    all_bufs[2] = &lits
    all_bufs[3] = &floats
    all_bufs[4] = &toks
    all_bufs[5] = &grefs
    try:
        if ptrs == NULL or lens == NULL:
            raise MemoryError()
        for k in range(count):
            payload = held[k]
            ptrs[k] = <const uint8_t*>payload
            lens[k] = len(payload)
            total += lens[k]
        hashes_init(&h, total // 9)
        with nogil:
            failed = split_all(ptrs, lens, count, verbatim, &sizes, all_bufs, &h, &kept, g)
        if failed:
            raise MemoryError()
        parts = (taken(&sizes), taken(&skel), taken(&refs), taken(&lits), taken(&floats),
                 taken(&toks))
        return (parts if g == NULL else parts + (taken(&grefs),)), kept
    finally:
        hashes_free(&h)
        for i in range(6):
            free(all_bufs[i].p)
        free(sizes.p)
        free(ptrs)
        free(lens)


def join(Py_ssize_t count, bytes sizes, bytes skel, bytes refs, bytes lits, bytes floats,
         bytes toks, bytes grefs=b"", GranuleIndex granules=None):
    """The `count` payloads `split` made these columns of (with `granules`: the index it was
    given); ValueError if they do not hold them all, exactly. The walk runs without the GIL
    (the writer checks each chunk it packs this way, while the ingest thread wants the GIL)."""
    cdef Buf out
    cdef const Granules* g = NULL if granules is None else &granules.g
    cdef const uint8_t* cols[7]
    cdef Py_ssize_t lens[7]
    cdef tuple held = (sizes, skel, refs, lits, floats, toks, grefs)
    # Each payload takes a byte of the sizes at least: a count past them is cut short within
    # len(sizes) + 1 payloads, and `starts` is never sized by a hostile count (nor overflows).
    cdef Py_ssize_t k, n = min(max(count, 0), len(sizes) + 1)
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
    cdef int failed
    memset(&out, 0, sizeof(Buf))
    try:
        if starts == NULL:
            raise MemoryError()
        gathered(held, cols, lens, &out)
        with nogil:
            failed = join_all(n, cols, lens, g, &out, starts)
        if failed == -2:
            raise MemoryError()
        if failed:
            raise ValueError({-1: "log columns: sizes cut short",
                              -3: "log columns: a payload does not come back whole",
                              -4: "log columns: bytes left over"}[failed])
        return [PyBytes_FromStringAndSize(<char*>out.p + starts[k], starts[k + 1] - starts[k])
                for k in range(n)]
    finally:
        free(out.p)
        free(starts)


def joins_back(list payloads, bytes sizes, bytes skel, bytes refs, bytes lits, bytes floats,
               bytes toks, bytes grefs=b"", GranuleIndex granules=None):
    """Whether `join` gives `payloads` back from these columns, exactly: the check of a chunk
    packed, its walk and comparison without the GIL, and no bytes object made per payload."""
    cdef Buf out
    cdef const Granules* g = NULL if granules is None else &granules.g
    cdef const uint8_t* cols[7]
    cdef Py_ssize_t lens[7]
    cdef tuple held = (sizes, skel, refs, lits, floats, toks, grefs)
    cdef Py_ssize_t k, count = len(payloads)
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    cdef const uint8_t** ptrs = <const uint8_t**>malloc((count + 1) * sizeof(uint8_t*))
    cdef Py_ssize_t* plens = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    cdef int failed
    cdef bint same = True
    cdef bytes col
    memset(&out, 0, sizeof(Buf))
    try:
        if starts == NULL or ptrs == NULL or plens == NULL:
            raise MemoryError()
        if count > len(sizes) + 1:  # each payload takes a byte of the sizes at least
            return False
        gathered(held, cols, lens, &out)
        for k in range(count):
            col = payloads[k]  # the list holds each: their buffers stay put
            ptrs[k] = <const uint8_t*>col
            plens[k] = len(col)
        with nogil:
            failed = join_all(count, cols, lens, g, &out, starts)
            if failed == 0:
                for k in range(count):
                    if (starts[k + 1] - starts[k] != plens[k]
                            or memcmp(out.p + starts[k], ptrs[k], plens[k]) != 0):
                        same = False
                        break
        if failed == -2:
            raise MemoryError()
        return failed == 0 and same
    finally:
        free(out.p)
        free(starts)
        free(ptrs)
        free(plens)
