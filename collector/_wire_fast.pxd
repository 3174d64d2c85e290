# What the fused replay's first pass (collector/_fused_read.pyx) shares with the compiled decoder
# (collector/_wire_fast.pyx) besides their checks (collector/_wire_checks.pxd): the table key of
# an event, through the same cache of the last one (its bytes matched inline).
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

from kvscope.collector._msgpack cimport Reader
from kvscope.collector._wire_scan cimport F_GROUP, F_MEDIUM, Event


cdef enum:
    # The longest medium and group_idx values (their msgpack bytes) that `_LastKey` keeps as
    # they came: a fixstr medium, any int group.
    RAW_MEDIUM_CAP = 32
    RAW_GROUP_CAP = 9


cdef inline bint same_bytes(const uint8_t* a, const uint8_t* b, Py_ssize_t n) noexcept nogil:
    """memcmp(a, b, n) == 0 for a few bytes (a medium's), without a call."""
    cdef Py_ssize_t k
    for k in range(n):
        if a[k] != b[k]:
            return False
    return True


cdef inline bint same_raw(Reader* r, Py_ssize_t pos, const uint8_t* raw, Py_ssize_t n,
                          uint64_t word, uint64_t mask) noexcept nogil:
    """Whether the field value at `pos` (-1: absent) is the `n` bytes `raw` (n -1: absent); `word`
    and `mask`: `raw` loaded as a word and the mask of its `n` bytes, where n <= 8.
    msgpack values are prefix-free: a value that starts with all of another's bytes is it."""
    cdef uint64_t loaded
    if n < 0:
        return pos < 0
    if pos < 0 or n > r.end - pos:
        return False
    if n <= 8 and r.end - pos >= 8:  # one load and compare, not a byte at a time
        memcpy(&loaded, r.p + pos, 8)
        return (loaded ^ word) & mask == 0
    return same_bytes(r.p + pos, raw, n)


cdef class _LastKey:
    cdef bytes medium  # None: nil
    cdef bint group_nil
    cdef int64_t group
    cdef object key
    # The medium and group_idx of `key` as their msgpack bytes came (raw_* -1: absent), when
    # `raw_held` (both short enough): the same bytes again are the same key, with nothing read.
    cdef bint raw_held
    cdef Py_ssize_t raw_medium, raw_group
    cdef uint8_t raw_medium_bytes[RAW_MEDIUM_CAP]
    cdef uint8_t raw_group_bytes[RAW_GROUP_CAP]
    cdef uint64_t raw_medium_word, raw_medium_mask, raw_group_word, raw_group_mask

    cdef object key_of(self, Reader* r, Event* e)

    cdef inline bint repeats(self, Reader* r, Event* e) noexcept:
        """Whether event `e`'s medium and group_idx are the bytes of `key`'s."""
        return (
            self.raw_held
            and same_raw(
                r, e.at[F_MEDIUM], self.raw_medium_bytes, self.raw_medium,
                self.raw_medium_word, self.raw_medium_mask,
            )
            and same_raw(
                r, e.at[F_GROUP], self.raw_group_bytes, self.raw_group,
                self.raw_group_word, self.raw_group_mask,
            )
        )

    cdef inline object of(self, Reader* r, Event* e):
        """`key_of`, without a call where the event's medium and group_idx bytes are the last
        key's."""
        if self.repeats(r, e):
            return self.key
        return self.key_of(r, e)
