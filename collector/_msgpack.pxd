# The msgpack reader under the compiled decoder (collector/_wire_fast.pyx): a cursor over one
# payload's bytes and the reads of msgpack's primitives, each checked against the payload's end.
# All inline: they compile into the module that cimports them, so the decoder's hot loop is one
# C module the compiler inlines across.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy


# Big-endian loads of msgpack's uint16/32/64 items: one load and a byte swap where the compiler
# has one, not a shift and an or per byte (collector/_wire_scan.pxd's token loop runs for every
# token id; `read_be` for every wide int, a parent hash in each stored event).
cdef extern from *:
    """
    #include <string.h>
    #if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) \
        && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    static inline uint32_t kvscope_be16(const uint8_t* p) {
        uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
    static inline uint32_t kvscope_be32(const uint8_t* p) {
        uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
    static inline uint64_t kvscope_be64(const uint8_t* p) {
        uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
    #else
    static inline uint32_t kvscope_be16(const uint8_t* p) {
        return ((uint32_t)p[0] << 8) | p[1]; }
    static inline uint32_t kvscope_be32(const uint8_t* p) {
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]; }
    static inline uint64_t kvscope_be64(const uint8_t* p) {
        return ((uint64_t)kvscope_be32(p) << 32) | kvscope_be32(p + 4); }
    #endif
    """
    uint32_t be16 "kvscope_be16"(const uint8_t* p) noexcept nogil
    uint32_t be32 "kvscope_be32"(const uint8_t* p) noexcept nogil
    uint64_t be64 "kvscope_be64"(const uint8_t* p) noexcept nogil


cdef enum:
    MAX_DEPTH = 64  # nesting a skipped value may have; msgspec goes deeper, but not vLLM: fall back


cdef struct Reader:
    const uint8_t* p
    Py_ssize_t pos
    Py_ssize_t end


# --- primitives: 0 when read, -1 when not there, not of that kind, or cut short ---------------
cdef inline int read_be(Reader* r, int width, uint64_t* out) noexcept nogil:
    """A big-endian unsigned int of `width` bytes."""
    cdef const uint8_t* p = r.p + r.pos
    cdef uint64_t v = 0
    cdef int i
    if r.end - r.pos < width:
        return -1
    if width == 8:
        v = be64(p)
    elif width == 4:
        v = be32(p)
    elif width == 2:
        v = be16(p)
    else:
        for i in range(width):
            v = (v << 8) | p[i]
    r.pos += width
    out[0] = v
    return 0


cdef inline int read_int(Reader* r, int64_t* i, uint64_t* u, bint* unsigned) noexcept nogil:
    """Any msgpack int: a value >= 0 in `u` (`unsigned` set), else in `i`."""
    cdef uint8_t b
    cdef int width
    cdef uint64_t v
    if r.pos >= r.end:
        return -1
    b = r.p[r.pos]
    if b <= 0x7F:
        r.pos += 1
        u[0] = b
        unsigned[0] = True
        return 0
    if b >= 0xE0:
        r.pos += 1
        i[0] = <int64_t>b - 256
        unsigned[0] = False
        return 0
    if 0xCC <= b <= 0xD3:
        r.pos += 1
        width = 1 << ((b - 0xCC) & 3)
        if read_be(r, width, &v) < 0:
            return -1
        if b >= 0xD0 and v >> (8 * width - 1):  # int8..int64 with the sign bit set
            if width < 8:
                v |= ~((<uint64_t>1 << (8 * width)) - 1)
            i[0] = <int64_t>v
            unsigned[0] = False
        else:
            u[0] = v
            unsigned[0] = True
        return 0
    return -1


cdef inline int read_uint64(Reader* r, uint64_t* out) noexcept nogil:
    """A non-negative int (a hash, a token id), in whatever int format it came."""
    cdef int64_t i
    cdef bint unsigned
    if read_int(r, &i, out, &unsigned) < 0 or not unsigned:
        return -1
    return 0


cdef inline int read_int64(Reader* r, int64_t* out) noexcept nogil:
    """An int in int64's range (a uint64 above it is left to msgspec)."""
    cdef uint64_t u
    cdef bint unsigned
    if read_int(r, out, &u, &unsigned) < 0:
        return -1
    if unsigned:
        if u >> 63:
            return -1
        out[0] = <int64_t>u
    return 0


cdef inline bint read_nil(Reader* r) noexcept nogil:
    """Steps over a nil, if that is what comes next."""
    if r.pos < r.end and r.p[r.pos] == 0xC0:
        r.pos += 1
        return True
    return False


cdef inline int read_len(Reader* r, uint8_t b, uint8_t fix, uint8_t fix_mask, uint8_t wide,
                         int per_item, Py_ssize_t* n) noexcept nogil:
    """The length in a str, array or map header whose first byte `b` is already taken: its fix
    form, or its wide forms from `wide` on (str8/16/32 from 0xD9, array16/32 from 0xDC, map16/32
    from 0xDE). -1 if `b` is none of them, or the header promises more items than bytes are left.
    """
    cdef uint64_t v
    cdef int first = 1 if wide == 0xD9 else 2  # bytes of the length in the first wide form
    cdef int last = wide + (2 if wide == 0xD9 else 1)
    if (b & ~fix_mask) == fix:
        v = b & fix_mask
    elif wide <= b <= last:
        if read_be(r, first << (b - wide), &v) < 0:
            return -1
    else:
        return -1
    if <uint64_t>(r.end - r.pos) < v * per_item:  # each item takes a byte at least
        return -1
    n[0] = <Py_ssize_t>v
    return 0


cdef inline int read_str(Reader* r, const uint8_t** s, Py_ssize_t* n) noexcept nogil:
    if r.pos >= r.end:
        return -1
    r.pos += 1
    if read_len(r, r.p[r.pos - 1], 0xA0, 0x1F, 0xD9, 1, n) < 0:
        return -1
    s[0] = r.p + r.pos
    r.pos += n[0]
    return 0


cdef inline int read_array(Reader* r, Py_ssize_t* n) noexcept nogil:
    if r.pos >= r.end:
        return -1
    r.pos += 1
    return read_len(r, r.p[r.pos - 1], 0x90, 0x0F, 0xDC, 1, n)


cdef inline int read_map(Reader* r, Py_ssize_t* n) noexcept nogil:
    if r.pos >= r.end:
        return -1
    r.pos += 1
    return read_len(r, r.p[r.pos - 1], 0x80, 0x0F, 0xDE, 2, n)


cdef inline int advance(Reader* r, uint64_t n) noexcept nogil:
    if <uint64_t>(r.end - r.pos) < n:
        return -1
    r.pos += <Py_ssize_t>n
    return 0


cdef inline int read_float(Reader* r, double* out) noexcept nogil:
    """A float32 or float64 (an int ts is msgspec's to convert); NaN and infinities too."""
    cdef uint64_t v
    cdef uint32_t v32
    cdef float f
    if r.pos >= r.end:
        return -1
    if r.p[r.pos] == 0xCB:
        r.pos += 1
        if read_be(r, 8, &v) < 0:
            return -1
        memcpy(out, &v, 8)
        return 0
    if r.p[r.pos] == 0xCA:
        r.pos += 1
        if read_be(r, 4, &v) < 0:
            return -1
        v32 = <uint32_t>v
        memcpy(&f, &v32, 4)
        out[0] = f
        return 0
    return -1


cdef inline Reader at(Reader* r, Py_ssize_t pos) noexcept nogil:
    """A reader of the same payload, at `pos`."""
    cdef Reader field = r[0]
    field.pos = pos
    return field


cdef inline int skip(Reader* r, int depth) noexcept nogil:
    """Steps over one value of any type, nested ones included."""
    cdef uint8_t b
    cdef uint64_t n
    cdef Py_ssize_t items, k
    if depth > MAX_DEPTH or r.pos >= r.end:
        return -1
    b = r.p[r.pos]
    if b <= 0x7F or b >= 0xE0 or b == 0xC0 or b == 0xC2 or b == 0xC3:
        r.pos += 1
        return 0
    if 0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB:
        r.pos += 1
        if read_len(r, b, 0xA0, 0x1F, 0xD9, 1, &items) < 0:
            return -1
        return advance(r, items)
    if b <= 0x9F or 0xDC <= b <= 0xDF:  # a map or an array
        if b <= 0x8F or b >= 0xDE:
            if read_map(r, &items) < 0:
                return -1
            items *= 2  # keys and values
        elif read_array(r, &items) < 0:
            return -1
        for k in range(items):
            if r.pos >= r.end:
                return -1
            b = r.p[r.pos]
            # Ints and nils (token ids, hashes, extra keys) are stepped over here: a call per
            # item would cost more than the step.
            if b <= 0x7F or b >= 0xE0 or b == 0xC0:
                r.pos += 1
            elif 0xCC <= b <= 0xD3:
                r.pos += 1
                if advance(r, 1 << ((b - 0xCC) & 3)) < 0:
                    return -1
            elif skip(r, depth + 1) < 0:
                return -1
        return 0
    r.pos += 1
    if 0xC4 <= b <= 0xC6:  # bin8/16/32
        if read_be(r, 1 << (b - 0xC4), &n) < 0:
            return -1
        return advance(r, n)
    if 0xC7 <= b <= 0xC9:  # ext8/16/32: length, type byte, data
        if read_be(r, 1 << (b - 0xC7), &n) < 0:
            return -1
        return advance(r, n + 1)
    if b == 0xCA or b == 0xCB:  # float32/64
        return advance(r, 4 if b == 0xCA else 8)
    if 0xCC <= b <= 0xD3:  # uint8..64, int8..64
        return advance(r, 1 << ((b - 0xCC) & 3))
    if 0xD4 <= b <= 0xD8:  # fixext1..16: type byte, data
        return advance(r, 1 + (1 << (b - 0xD4)))
    return -1  # 0xC1: never used
