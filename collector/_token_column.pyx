# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A table's tokens column, packed: each slot's block of tokens at the table's token bit width.

Token ids are below the model's vocabulary size (about 2**17 for 128k): as uint32s they took
half of what a cached block held. Here they take the bit length of the largest token stored so
far; a wider token repacks the column once, at the new width (widths never shrink). A slot's
block is `stride` whole bytes ending with zero bits, so blocks compare as bytes: a lookup packs
its query at the same width (`pack_query`). Outside, tokens are uint32s: `to_uint32` and
`assign` are what checkpoints read and write, so their format does not depend on the width.
"""

import array

from cpython cimport array as carray
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcpy

from kvscope.collector._checkpoint_columns import intern_records
from kvscope.collector._token_bits cimport (
    bit_length,
    largest,
    pack,
    pack_bytes,
    packed_size,
    unpack,
    unpack_within,
)

cdef carray.array _BYTES = array.array("B")
cdef carray.array _UINT32 = array.array("I")


cdef carray.array _zeros(Py_ssize_t n):
    cdef carray.array made = carray.clone(_BYTES, n, True)
    return made


cdef class TokenColumn:
    """Slot -> a block of `block_size` tokens, packed at `width` bits a token."""

    def __init__(self):
        self._data = _zeros(0)
        self.width = 1  # (zero tokens take a bit too)
        self.block_size = self.stride = self.slots = 0

    cdef int prepare(self, Py_ssize_t block_size, const uint32_t* tokens, Py_ssize_t n) except -1:
        """Be ready to `put` these tokens (blocks of `block_size`): widen if one is wider."""
        if block_size != self.block_size:
            if self.slots:
                raise ValueError("a tokens column holds blocks of one size")
            self.block_size = block_size
            self.stride = packed_size(block_size, self.width)
        cdef int width = bit_length(largest(tokens, n))
        if width > self.width:
            self._widen(width)
        return 0

    cdef int cover(self, Py_ssize_t slots) except -1:
        """Hold slots up to `slots` (zero tokens in the new ones)."""
        if slots > self.slots:
            self._data.frombytes(bytes((slots - self.slots) * self.stride))
            self.slots = slots
        return 0

    cdef int _widen(self, int width) except -1:
        """Repack every slot at `width` bits."""
        cdef Py_ssize_t bs = self.block_size, stride = packed_size(bs, width), slot
        cdef carray.array wider = _zeros(self.slots * stride)
        cdef uint8_t* out = <uint8_t*>wider.data.as_voidptr
        cdef uint32_t* block = <uint32_t*>PyMem_Malloc(max(bs, 1) * sizeof(uint32_t))
        if block == NULL:
            raise MemoryError()
        for slot in range(self.slots):
            unpack(block, self.at(slot), bs, self.width)
            pack(out + slot * stride, block, bs, width)
        PyMem_Free(block)
        self._data, self.width, self.stride = wider, width, stride
        return 0

    cdef bytes block_bytes(self, Py_ssize_t slot):
        """`slot`'s tokens as uint32 bytes (how `_roots` keys a first block)."""
        cdef bytes made = PyBytes_FromStringAndSize(NULL, self.block_size * sizeof(uint32_t))
        unpack(<uint32_t*>PyBytes_AS_STRING(made), self.at(slot), self.block_size, self.width)
        return made

    def block(self, Py_ssize_t slot):
        """`slot`'s tokens, as a tuple of ints."""
        return tuple(array.array("I", self.block_bytes(slot)))

    def to_uint32(self):
        """The whole column as uint32 tokens, a block a slot: a checkpoint's tokens column."""
        cdef Py_ssize_t bs = self.block_size, slot, end = self.slots * self.stride
        cdef carray.array tokens = carray.clone(_UINT32, self.slots * bs, False)
        for slot in range(self.slots):
            unpack_within(
                tokens.data.as_uints + slot * bs, self.at(slot), bs, self.width,
                end - slot * self.stride,
            )
        return tokens

    def interned(self):
        """`intern_records` of `to_uint32()` in blocks (numbers, distinct blocks' uint32 bytes),
        without the column unpacked: packed blocks are equal exactly when their tokens are,
        so they are numbered as they lie and only the distinct ones unpacked."""
        cdef Py_ssize_t bs = self.block_size, stride = self.stride, k, distinct
        if bs <= 0 or stride <= 0:
            raise ValueError("a tokens column of no block size")
        numbers, packed = intern_records(
            memoryview(self._data).cast("B")[: self.slots * stride], stride
        )
        distinct = len(packed) // stride
        # As bytes, as `intern_records` gives its records.
        cdef carray.array records = carray.clone(_BYTES, distinct * bs * 4, False)
        cdef uint32_t* out = <uint32_t*>records.data.as_voidptr
        cdef const uint8_t[::1] src = packed
        for k in range(distinct):
            unpack_within(
                out + k * bs, &src[k * stride], bs, self.width,
                (distinct - k) * stride,
            )
        return numbers, records

    def assign(self, Py_ssize_t block_size, tokens):
        """Hold `tokens` (an `array("I")`, a block a slot), packed at their own width."""
        cdef carray.array plain = tokens
        cdef Py_ssize_t n = len(plain), slot
        if n and (block_size <= 0 or n % block_size):
            raise ValueError("a tokens column holds whole blocks")
        self.block_size = block_size
        self.slots = n // block_size if n else 0
        self.width = max(1, bit_length(largest(plain.data.as_uints, n)))
        self.stride = packed_size(block_size, self.width)
        self._data = _zeros(self.slots * self.stride)
        for slot in range(self.slots):
            self.put(slot, plain.data.as_uints + slot * block_size)

    def assign_records(self, Py_ssize_t block_size, const uint32_t[::1] numbers,
                       const uint8_t[::1] records):
        """`assign` of the column that `numbers` make of `records` (blocks of `block_size`
        tokens: a checkpoint's distinct token blocks), without making it: each block used is
        packed once, then copied to its slots. ValueError for a number past the blocks."""
        cdef Py_ssize_t record = block_size * 4, n = numbers.shape[0], i, k, distinct
        if block_size <= 0 or records.shape[0] % record:
            raise ValueError(f"{records.shape[0]} bytes are not blocks of {block_size} tokens")
        distinct = records.shape[0] // record
        used = bytearray(distinct)
        cdef uint8_t* is_used = used
        for i in range(n):
            if numbers[i] >= <uint32_t>distinct:
                raise ValueError(f"token block {numbers[i]} of {distinct}")
            is_used[numbers[i]] = 1
        cdef carray.array block = carray.clone(_UINT32, block_size, False)
        cdef uint32_t* plain = block.data.as_uints
        cdef uint32_t top = 0
        for k in range(distinct):
            if is_used[k]:
                memcpy(plain, &records[k * record], record)
                top |= largest(plain, block_size)
        self.block_size, self.slots = block_size, n
        self.width = max(1, bit_length(top))
        self.stride = packed_size(block_size, self.width)
        cdef carray.array packed = carray.clone(_BYTES, distinct * self.stride, False)
        cdef uint8_t* at = <uint8_t*>packed.data.as_voidptr
        for k in range(distinct):
            if is_used[k]:
                memcpy(plain, &records[k * record], record)
                pack(at + k * self.stride, plain, block_size, self.width)
        self._data = carray.clone(_BYTES, n * self.stride, False)
        cdef uint8_t* out = <uint8_t*>self._data.data.as_voidptr
        for i in range(n):
            memcpy(out + i * self.stride, at + numbers[i] * self.stride, self.stride)


def pack_query(tokens, Py_ssize_t block_size, int width):
    """(The leading blocks of `tokens`, an `array("I")`, packed as a column of `width` holds
    them; how many blocks that is): it stops before the first block with a token wider than
    `width`, which no block of the column holds."""
    cdef carray.array plain = tokens
    cdef Py_ssize_t blocks = len(plain) // block_size if block_size > 0 else 0, usable = 0
    cdef uint32_t* at = plain.data.as_uints
    while usable < blocks and bit_length(largest(at + usable * block_size, block_size)) <= width:
        usable += 1
    cdef Py_ssize_t stride = packed_size(block_size, width), i
    cdef bytes packed = PyBytes_FromStringAndSize(NULL, usable * stride)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(packed)
    for i in range(usable):
        pack(out + i * stride, at + i * block_size, block_size, width)
    return packed, usable


def _packed_ways(tokens, int width, Py_ssize_t pad):
    """For tests: `tokens` (an `array("I")`, each below 2**width) packed by `pack` and by its
    general loop (`pack_bytes`), each into `pad` bytes more than it takes, all 0xFF before:
    a write past the packed bytes shows in them."""
    cdef carray.array plain = tokens
    cdef Py_ssize_t n = len(plain), size = packed_size(n, width) + pad
    if not 1 <= width <= 32 or pad < 0:
        raise ValueError("a width is 1 to 32 bits, a pad at least 0 bytes")
    if bit_length(largest(plain.data.as_uints, n)) > width:
        raise ValueError(f"a token is wider than {width} bits")
    cdef bytearray fast = bytearray(b"\xff" * size), general = bytearray(b"\xff" * size)
    pack(<uint8_t*><char*>fast, plain.data.as_uints, n, width)
    if width < 32:
        pack_bytes(<uint8_t*><char*>general, plain.data.as_uints, n, width)
    else:
        memcpy(<char*>general, plain.data.as_uints, n * 4)
    return bytes(fast), bytes(general)
