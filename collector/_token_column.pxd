# A table's tokens column, packed at the table's token bit width (collector/_token_column.pyx):
# cimported by the table's core, which writes it, and by the lookup, which compares its bytes.
from cpython cimport array as carray
from libc.stdint cimport uint8_t, uint32_t

from kvscope.collector._token_bits cimport pack


cdef class TokenColumn:
    cdef carray.array _data  # `stride` bytes a slot, for the slots from 0 to `slots`
    cdef readonly int width  # bits a token: the bit length of the largest stored so far, or 1
    cdef readonly Py_ssize_t block_size, stride, slots

    cdef int prepare(self, Py_ssize_t block_size, const uint32_t* tokens, Py_ssize_t n) except -1
    cdef int cover(self, Py_ssize_t slots) except -1
    cdef int _widen(self, int width) except -1
    cdef bytes block_bytes(self, Py_ssize_t slot)

    cdef inline uint8_t* at(self, Py_ssize_t slot) noexcept:
        return <uint8_t*>self._data.data.as_voidptr + slot * self.stride

    cdef inline void put(self, Py_ssize_t slot, const uint32_t* tokens) noexcept:
        """Write a block's tokens at `slot` (covered, and `prepare`d for these tokens)."""
        pack(self.at(slot), tokens, self.block_size, self.width)
