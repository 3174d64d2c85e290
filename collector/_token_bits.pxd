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


cdef extern from *:
    """
    /* `pack` below 32 bits, eight tokens a step: eight tokens of `w` bits are `w` whole
       bytes, so each step starts on a byte. Each width has its own copy of the step, where
       every shift is a constant and the step's branches fold away. */
    #include <string.h>
    static inline __attribute__((always_inline)) void kvscope_pack_run(
            uint8_t* out, const uint32_t* tokens, Py_ssize_t n, int w) {
        /* Any number of tokens, four bytes at a time, in any byte order. */
        uint64_t acc = 0;
        int held = 0;  /* bits in acc not written yet: below 32 between tokens */
        Py_ssize_t i;
        for (i = 0; i < n; i++) {
            acc |= ((uint64_t)tokens[i]) << held;
            held += w;
            if (held >= 32) {
                out[0] = (uint8_t)acc; out[1] = (uint8_t)(acc >> 8);
                out[2] = (uint8_t)(acc >> 16); out[3] = (uint8_t)(acc >> 24);
                out += 4; acc >>= 32; held -= 32;
            }
        }
        while (held > 0) { *out++ = (uint8_t)acc; acc >>= 8; held -= 8; }
    }
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    static inline __attribute__((always_inline)) void kvscope_pack_eight(
            uint8_t* out, const uint32_t* tokens, int w) {
        /* Eight tokens, eight bytes a store (a word's bytes in order: little-endian only).
           A token the word cannot take whole goes on in the next (held >= 33 there). */
        uint64_t acc = 0, v;
        int held = 0, j;  /* bits in acc not written yet: below 64 */
        for (j = 0; j < 8; j++) {
            v = tokens[j];
            acc |= v << held;
            if (held + w >= 64) {
                memcpy(out, &acc, 8);
                out += 8;
                acc = v >> (64 - held);
                held += w - 64;
            } else {
                held += w;
            }
        }
        memcpy(out, &acc, held / 8);  /* 8 * w bits in all: what is left is whole bytes */
    }
    #else
    #define kvscope_pack_eight(out, tokens, w) kvscope_pack_run(out, tokens, 8, w)
    #endif
    #define KVSCOPE_PACK_WIDTH(W) \
        static void kvscope_pack_##W(uint8_t* out, const uint32_t* tokens, Py_ssize_t n) { \
            Py_ssize_t g = 0; \
            for (; g + 8 <= n; g += 8, out += W) kvscope_pack_eight(out, tokens + g, W); \
            kvscope_pack_run(out, tokens + g, n - g, W); \
        }
    KVSCOPE_PACK_WIDTH(1) KVSCOPE_PACK_WIDTH(2) KVSCOPE_PACK_WIDTH(3) KVSCOPE_PACK_WIDTH(4)
    KVSCOPE_PACK_WIDTH(5) KVSCOPE_PACK_WIDTH(6) KVSCOPE_PACK_WIDTH(7) KVSCOPE_PACK_WIDTH(8)
    KVSCOPE_PACK_WIDTH(9) KVSCOPE_PACK_WIDTH(10) KVSCOPE_PACK_WIDTH(11) KVSCOPE_PACK_WIDTH(12)
    KVSCOPE_PACK_WIDTH(13) KVSCOPE_PACK_WIDTH(14) KVSCOPE_PACK_WIDTH(15) KVSCOPE_PACK_WIDTH(16)
    KVSCOPE_PACK_WIDTH(17) KVSCOPE_PACK_WIDTH(18) KVSCOPE_PACK_WIDTH(19) KVSCOPE_PACK_WIDTH(20)
    KVSCOPE_PACK_WIDTH(21) KVSCOPE_PACK_WIDTH(22) KVSCOPE_PACK_WIDTH(23) KVSCOPE_PACK_WIDTH(24)
    KVSCOPE_PACK_WIDTH(25) KVSCOPE_PACK_WIDTH(26) KVSCOPE_PACK_WIDTH(27) KVSCOPE_PACK_WIDTH(28)
    KVSCOPE_PACK_WIDTH(29) KVSCOPE_PACK_WIDTH(30) KVSCOPE_PACK_WIDTH(31)
    typedef void (*kvscope_pack_t)(uint8_t*, const uint32_t*, Py_ssize_t);
    static const kvscope_pack_t kvscope_pack_widths[32] = {
        0, kvscope_pack_1, kvscope_pack_2, kvscope_pack_3, kvscope_pack_4, kvscope_pack_5,
        kvscope_pack_6, kvscope_pack_7, kvscope_pack_8, kvscope_pack_9, kvscope_pack_10,
        kvscope_pack_11, kvscope_pack_12, kvscope_pack_13, kvscope_pack_14, kvscope_pack_15,
        kvscope_pack_16, kvscope_pack_17, kvscope_pack_18, kvscope_pack_19, kvscope_pack_20,
        kvscope_pack_21, kvscope_pack_22, kvscope_pack_23, kvscope_pack_24, kvscope_pack_25,
        kvscope_pack_26, kvscope_pack_27, kvscope_pack_28, kvscope_pack_29, kvscope_pack_30,
        kvscope_pack_31,
    };
    static inline void kvscope_pack_narrow(
            uint8_t* out, const uint32_t* tokens, Py_ssize_t n, int w) {
        kvscope_pack_widths[w](out, tokens, n);
    }
    """
    # `pack` for a width of 1 to 31 bits.
    void pack_narrow "kvscope_pack_narrow"(
        uint8_t* out, const uint32_t* tokens, Py_ssize_t n, int width
    ) noexcept nogil


cdef inline void pack(uint8_t* out, const uint32_t* tokens, Py_ssize_t n, int width) noexcept nogil:
    """Write `n` tokens, each below 2**width, as packed_size(n, width) bytes."""
    if width == 32:
        memcpy(out, tokens, n * 4)
        return
    pack_narrow(out, tokens, n, width)


cdef inline void pack_bytes(uint8_t* out, const uint32_t* tokens, Py_ssize_t n,
                            int width) noexcept nogil:
    """`pack` below 32 bits, a token a step with the width a variable: the general loop, what
    tests hold `pack_narrow` to."""
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
