# A chunk's log columns read back (storage/_log_columns.pyx's `join` and `joins_back`, and the
# check of each chunk packed): the columns as pointers, and whether they join into given
# payloads, without the GIL. Inline: they compile into the module that cimports them.
from libc.stdint cimport uint8_t

from kvscope.storage._granules cimport Granules
from kvscope.storage._log_buf cimport Buf, reserve
from kvscope.storage._log_walk cimport same_all


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
    not, -1 if memory ran out. `join_all`'s walk, each piece compared with the payloads where
    it would be put: nothing is joined into a buffer to be compared after."""
    return same_all(count, cols, lens, g, ptrs, plens)
