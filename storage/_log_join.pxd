# A chunk's log columns read back (storage/_log_columns.pyx's `join` and `joins_back`, and the
# check of each chunk packed): the columns as pointers, and whether they join into given
# payloads, without the GIL. Inline: they compile into the module that cimports them.
from libc.stdint cimport uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memset

from kvscope.storage._granules cimport Granules
from kvscope.storage._log_buf cimport Buf, grow_nogil, reserve
from kvscope.storage._log_walk cimport join_all


cdef inline int gathered(tuple held, const uint8_t** cols, Py_ssize_t* lens, Buf* out) except -1:
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


cdef inline int same_back(
    Py_ssize_t count, const uint8_t** cols, const Py_ssize_t* lens, const Granules* g,
    const uint8_t** ptrs, const Py_ssize_t* plens,
) noexcept nogil:
    """`joins_back`'s answer: 1 if the columns join into the `count` payloads exactly, 0 if
    not, -1 if memory ran out."""
    cdef Buf out
    cdef Py_ssize_t k
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    cdef int failed, same = 1
    memset(&out, 0, sizeof(Buf))
    if starts == NULL or grow_nogil(&out, 4 * lens[1] + lens[5] + lens[3] + lens[4]) < 0:
        free(starts)
        free(out.p)
        return -1
    failed = join_all(count, cols, lens, g, &out, starts)
    if failed == 0:
        for k in range(count):
            if (starts[k + 1] - starts[k] != plens[k]
                    or memcmp(out.p + starts[k], ptrs[k], plens[k]) != 0):
                same = 0
                break
    free(out.p)
    free(starts)
    return -1 if failed == -2 else same if failed == 0 else 0
