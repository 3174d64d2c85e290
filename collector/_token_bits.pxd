# Token ids packed at a fixed bit width, little-endian bit order, a block at a time: every read
# and write of a table's packed tokens column (collector/_token_column.pyx) and of a lookup's
# packed query goes through these. A block's bytes end with zero bits, so equal blocks are equal
# bytes (lookups compare them with memcmp).
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define KVSCOPE_BIT_LENGTH32(v) ((v) ? 32 - __builtin_clz(v) : 0)
    #else
    static int KVSCOPE_BIT_LENGTH32(uint32_t v) { int n = 0; while (v) { v >>= 1; n++; } return n; }
    #endif
    """
    int bit_length32 "KVSCOPE_BIT_LENGTH32"(uint32_t v) noexcept nogil


cdef extern from *:
    """
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    #define KVSCOPE_LITTLE_ENDIAN 1
    #else
    #define KVSCOPE_LITTLE_ENDIAN 0
    #endif
    """
    bint LITTLE_ENDIAN "KVSCOPE_LITTLE_ENDIAN"


cdef inline int bit_length(uint32_t v) noexcept nogil:
    # One instruction where the compiler has it, not a step a bit.
    return bit_length32(v)


cdef inline uint32_t largest(const uint32_t* tokens, Py_ssize_t n) noexcept nogil:
    cdef uint32_t top = 0
    cdef Py_ssize_t i
    for i in range(n):
        top |= tokens[i]  # the OR has the same bit length as the maximum, and no branch
    return top


cdef inline Py_ssize_t packed_size(Py_ssize_t n, int width) noexcept nogil:
    """Bytes that `n` tokens of `width` bits take."""
    return (n * width + 7) >> 3


cdef inline void pack(uint8_t* out, const uint32_t* tokens, Py_ssize_t n, int width) noexcept nogil:
    """Write `n` tokens, each below 2**width, as packed_size(n, width) bytes."""
    if width == 32:
        memcpy(out, tokens, n * 4)
        return
    cdef uint64_t acc = 0
    cdef int held = 0  # bits in `acc` not written yet: below 32 between tokens
    cdef Py_ssize_t i
    for i in range(n):
        acc |= (<uint64_t>tokens[i]) << held
        held += width
        if held >= 32:
            # Four bytes at a time, not one (one store, where the compiler merges them).
            out[0] = <uint8_t>acc
            out[1] = <uint8_t>(acc >> 8)
            out[2] = <uint8_t>(acc >> 16)
            out[3] = <uint8_t>(acc >> 24)
            out += 4
            acc >>= 32
            held -= 32
    while held > 0:
        out[0] = <uint8_t>acc
        out += 1
        acc >>= 8
        held -= 8


cdef inline void unpack_held(
    uint32_t* out, const uint8_t* packed, Py_ssize_t n, int width, uint64_t acc, int held
) noexcept nogil:
    """`unpack`'s loop, a byte at a time, from `held` bits already read into `acc`."""
    cdef uint64_t mask = ((<uint64_t>1) << width) - 1
    cdef Py_ssize_t i
    for i in range(n):
        while held < width:
            acc |= (<uint64_t>packed[0]) << held
            packed += 1
            held += 8
        out[i] = <uint32_t>(acc & mask)
        acc >>= width
        held -= width


cdef inline void unpack(uint32_t* out, const uint8_t* packed, Py_ssize_t n, int width) noexcept nogil:
    """Read `n` tokens that `pack` wrote at `width` bits."""
    if width == 32:
        memcpy(out, packed, n * 4)
        return
    unpack_held(out, packed, n, width, 0, 0)


cdef inline void unpack_within(
    uint32_t* out, const uint8_t* packed, Py_ssize_t n, int width, Py_ssize_t readable
) noexcept nogil:
    """`unpack`, a token a load of 8 bytes wherever `readable` bytes from `packed` hold them
    (the bits past the token are masked off: a column's blocks lie end to end), not a byte at a
    time; the last tokens, near the end, as `unpack` reads them."""
    if width == 32 or not LITTLE_ENDIAN:
        unpack(out, packed, n, width)
        return
    cdef uint64_t mask = ((<uint64_t>1) << width) - 1, word
    cdef Py_ssize_t i = 0, bit = 0
    while i < n and (bit >> 3) + 8 <= readable:
        memcpy(&word, packed + (bit >> 3), 8)
        out[i] = <uint32_t>((word >> (bit & 7)) & mask)
        bit += width
        i += 1
    if i == n:
        return
    packed += bit >> 3
    unpack_held(out + i, packed + 1, n - i, width, packed[0] >> (bit & 7), 8 - (bit & 7))
