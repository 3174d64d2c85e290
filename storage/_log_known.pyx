# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Format 6 of the log's chunks (storage/log_columns.py): the hash literals column split against a
# list of known hashes (a checkpoint's, storage/log_known.py). A removal names a block stored
# long before, in another chunk: its hash is a literal there, 8 bytes that do not compress, but
# the block is in the checkpoint the chunk follows, where its position takes about 2 bytes.
# A literal is read as the big-endian number its 8 bytes are (as msgpack holds it): one number
# is one string of bytes, so what comes back is those bytes, exactly.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize

from kvscope.collector._msgpack cimport be64 as load_be

import hashlib


cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    static inline uint64_t kv_load_le64(const uint8_t* p) {
        uint64_t v;
        memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        return __builtin_bswap64(v);
    #else
        return v;
    #endif
    }
    static inline void kv_store_le64(uint8_t* p, uint64_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        memcpy(p, &v, 8);
    }
    """
    uint64_t load_le "kv_load_le64"(const uint8_t* p) noexcept nogil
    void store_le "kv_store_le64"(uint8_t* p, uint64_t v) noexcept nogil


cdef enum:
    # A bucket holding more hashes than this has its width halved (up to MAX_HALVINGS times):
    # hashes that share their top bits but not the next ones spread again.
    WIDE_BUCKET = 64
    # At most four times the buckets the count asks for: past that, a bucket's search takes a
    # few more halvings.
    MAX_HALVINGS = 2
    # One bucket number kept per this many positions: a position's bucket (the join) is
    # searched for among a few buckets, not all.
    HINT_EVERY = 64


cdef class KnownHashes:
    """Hashes by their position in a list (8 bytes each, as msgpack holds them, strictly
    increasing read big-endian), for finding a literal's position and back.

    The list is cut into buckets, equal slices of the range from its first value to its last
    (the top bits of a value's offset from the first), and an index of where each bucket
    starts in the list leaves a short search among a few values. Within a bucket the values
    share those top bits: each is held as the bits below them alone (its offset from its
    bucket's start, in as few bytes as they take), which for random hashes is 6 bytes, not 8.
    The index takes 4 bytes per bucket, a bucket 4 to 8 hashes on average: the writer holds
    its latest checkpoint's hashes for as long as that is the latest."""

    cdef uint8_t* offsets  # position i's offset in its bucket: `width` bytes, little-endian
    cdef uint32_t* starts  # bucket b's hashes: positions starts[b] to starts[b + 1]
    cdef uint32_t* hints  # the bucket of position HINT_EVERY * j
    cdef uint64_t low, high, mask
    cdef int shift, width
    cdef readonly Py_ssize_t buckets
    cdef readonly Py_ssize_t count
    cdef readonly bytes digest
    """The values' digest (8 bytes of blake2b), made once: a reader checks it per chunk."""

    def __cinit__(self, bytes values):
        cdef Py_ssize_t i
        cdef uint64_t v, last = 0
        cdef const uint8_t* data = values
        if len(values) % 8:
            raise ValueError("known hashes: not 8-byte values")
        if len(values) // 8 >= 0xFFFFFFFF:
            raise ValueError("known hashes: too many")
        self.count = len(values) // 8
        # Positions are what a chunk stores: one hash at two would not come back as listed.
        for i in range(self.count):
            v = load_be(data + 8 * i)
            if i and v <= last:
                raise ValueError(f"known hashes: not strictly increasing at position {i}")
            last = v
        self.digest = hashlib.blake2b(values, digest_size=8).digest()
        self._index(data)
        self._keep(data)

    cdef _index(self, const uint8_t* data):
        cdef int wanted = 0, halvings = 0
        cdef uint64_t span
        cdef Py_ssize_t widest
        if self.count:  # else one empty bucket, at 0
            self.low = load_be(data)
            self.high = load_be(data + 8 * (self.count - 1))
        # 2^wanted buckets: 4 to 8 hashes each, as the count asks, over the span they take.
        while (self.count >> (wanted + 1)) >= 4:
            wanted += 1
        span = self.high - self.low
        self.shift = 0
        while self.shift < 63 and (span >> self.shift) >> wanted:
            self.shift += 1
        while True:
            widest = self._fill(data)
            if widest <= WIDE_BUCKET or self.shift == 0 or halvings == MAX_HALVINGS:
                break
            self.shift -= 1
            halvings += 1
        self.mask = ((<uint64_t>1) << self.shift) - 1
        self.width = max(1, (self.shift + 7) >> 3)

    cdef Py_ssize_t _fill(self, const uint8_t* data) except -1:
        """Bucket starts for the current shift; the most hashes one bucket holds."""
        cdef Py_ssize_t n = <Py_ssize_t>((self.high - self.low) >> self.shift) + 1
        cdef Py_ssize_t b, at = 0, widest = 0
        cdef uint32_t* starts = <uint32_t*>malloc((n + 1) * sizeof(uint32_t))
        if starts == NULL:
            raise MemoryError()
        free(self.starts)
        self.starts, self.buckets = starts, n
        with nogil:
            # The values ascend: each bucket's start is the first value past the one before.
            for b in range(n):
                starts[b] = <uint32_t>at
                while at < self.count and (
                    (load_be(data + 8 * at) - self.low) >> self.shift
                ) == <uint64_t>b:
                    at += 1
                if at - starts[b] > widest:
                    widest = at - starts[b]
            starts[n] = <uint32_t>at
        return widest

    cdef _keep(self, const uint8_t* data):
        """Each value's offset in its bucket, and the hints, once the buckets are final."""
        cdef Py_ssize_t i, b = 0, w = self.width, hinted = self.count // HINT_EVERY + 1
        cdef uint64_t off
        # 8 bytes past the last: a load of 8 from any record stays inside.
        self.offsets = <uint8_t*>malloc(w * self.count + 8)
        self.hints = <uint32_t*>malloc(hinted * sizeof(uint32_t))
        if self.offsets == NULL or self.hints == NULL:
            raise MemoryError()
        memset(self.offsets + w * self.count, 0, 8)
        with nogil:
            for i in range(self.count):
                off = (load_be(data + 8 * i) - self.low) & self.mask
                # All 8 bytes stored at once: those past `w` are 0 (the mask keeps `shift`
                # bits, at most 8 * w), and the next offsets, stored after, overwrite them.
                store_le(self.offsets + w * i, off)
                while self.starts[b + 1] <= i:
                    b += 1
                if i % HINT_EVERY == 0:
                    self.hints[i // HINT_EVERY] = <uint32_t>b
            if self.count % HINT_EVERY == 0:  # no position there: the last bucket
                self.hints[self.count // HINT_EVERY] = <uint32_t>(self.buckets - 1)

    def __dealloc__(self):
        free(self.starts)
        free(self.offsets)
        free(self.hints)

    @property
    def nbytes(self) -> int:
        """Bytes held for the lookup (the values, their index and the hints)."""
        return (
            self.width * self.count + 8
            + (self.buckets + 1) * sizeof(uint32_t)
            + (self.count // HINT_EVERY + 1) * sizeof(uint32_t)
        )

    @property
    def values(self) -> bytes:
        """The list, as given (8 bytes each, big-endian)."""
        cdef Py_ssize_t i
        cdef int k
        cdef uint64_t v
        out = PyBytes_FromStringAndSize(NULL, 8 * self.count)
        cdef uint8_t* dst = <uint8_t*><char*>out
        for i in range(self.count):
            v = self.value_at(i)
            for k in range(8):
                dst[8 * i + k] = <uint8_t>(v >> (56 - 8 * k))
        return out

    cdef inline uint64_t offset_at(self, Py_ssize_t i) noexcept nogil:
        return load_le(self.offsets + self.width * i) & self.mask

    cdef uint64_t value_at(self, Py_ssize_t at) noexcept nogil:
        """The value at position `at` (0 <= at < count): its bucket's start, then its offset."""
        cdef Py_ssize_t j = at // HINT_EVERY, lo = self.hints[j], n, half
        # The last bucket starting at or before `at`, from the hint's (which starts at or
        # before it) to the next hint's (which holds a later position).
        if j < self.count // HINT_EVERY:
            n = self.hints[j + 1] + 1 - lo
        else:
            n = self.buckets - lo
        while n > 1:
            half = n >> 1
            if self.starts[lo + half] <= at:
                lo += half
            n -= half
        return self.low + ((<uint64_t>lo) << self.shift) + self.offset_at(at)

    cdef inline Py_ssize_t find(self, uint64_t v) noexcept nogil:
        """The position of `v` (read big-endian), -1 if it is not listed."""
        cdef Py_ssize_t lo, n, half, w = self.width
        cdef uint64_t b, off, mask = self.mask
        cdef const uint8_t* offsets = self.offsets
        if v - self.low > self.high - self.low:  # below the first or past the last
            return -1
        b = (v - self.low) >> self.shift
        off = (v - self.low) & mask
        lo = self.starts[b]
        n = self.starts[b + 1] - lo
        if n == 0:
            return -1
        # The last offset not above `v`'s, by halving with no branch on the values (a
        # conditional move): a scan of a bucket's few random values would end on a branch
        # seldom guessed.
        while n > 1:
            half = n >> 1
            if (load_le(offsets + w * (lo + half)) & mask) <= off:
                lo += half
            n -= half
        return lo if (load_le(offsets + w * lo) & mask) == off else -1


def split_known(bytes lits, KnownHashes known):
    """`lits` (8-byte literals) as (a bitmap of those found in `known`, their positions there as
    four byte planes of 32-bit ints, the literals not found)."""
    cdef Py_ssize_t n = len(lits) // 8, i, k, found = 0, rest = 0
    cdef const uint8_t* p = lits
    cdef uint64_t v
    cdef Py_ssize_t at
    if len(lits) % 8:
        raise ValueError("hash literals: not 8-byte values")
    cdef uint32_t* positions = <uint32_t*>malloc((n + 1) * sizeof(uint32_t))
    cdef uint8_t* others = <uint8_t*>malloc(8 * n + 1)
    bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) // 8)
    cdef uint8_t* bits = <uint8_t*><char*>bitmap
    try:
        if positions == NULL or others == NULL:
            raise MemoryError()
        memset(bits, 0, (n + 7) // 8)
        with nogil:
            for i in range(n):
                v = load_be(p + 8 * i)
                at = known.find(v)
                if at >= 0:
                    bits[i >> 3] |= <uint8_t>(1 << (i & 7))
                    positions[found] = <uint32_t>at
                    found += 1
                else:
                    memcpy(others + 8 * rest, p + 8 * i, 8)
                    rest += 1
        planes = PyBytes_FromStringAndSize(NULL, 4 * found)
        out = <uint8_t*><char*>planes
        for i in range(found):
            for k in range(4):
                out[k * found + i] = <uint8_t>(positions[i] >> (8 * k))
        return bitmap, planes, PyBytes_FromStringAndSize(<char*>others, 8 * rest)
    finally:
        free(positions)
        free(others)


def join_known(bytes bitmap, bytes planes, bytes rest, KnownHashes known):
    """The literals `split_known` split; ValueError if these do not hold them exactly."""
    cdef Py_ssize_t found = len(planes) // 4, others = len(rest) // 8
    cdef Py_ssize_t n = found + others, i, k, f = 0, r = 0
    cdef const uint8_t* bits = bitmap
    cdef const uint8_t* pl = planes
    cdef const uint8_t* rp = rest
    cdef uint32_t at
    if len(planes) % 4 or len(rest) % 8 or len(bitmap) != (n + 7) // 8:
        raise ValueError("known hashes: columns do not match")
    if n % 8 and bits[n >> 3] >> (n & 7):
        raise ValueError("known hashes: bits past the literals")
    out = PyBytes_FromStringAndSize(NULL, 8 * n)
    cdef uint8_t* dst = <uint8_t*><char*>out
    cdef uint64_t v
    for i in range(n):
        if bits[i >> 3] & (1 << (i & 7)):
            if f == found:
                raise ValueError("known hashes: more marked than positions")
            at = 0
            for k in range(4):
                at |= <uint32_t>pl[k * found + f] << (8 * k)
            if at >= known.count:
                raise ValueError("known hashes: a position past the list")
            v = known.value_at(at)
            for k in range(8):
                dst[8 * i + k] = <uint8_t>(v >> (56 - 8 * k))
            f += 1
        else:
            if r == others:
                raise ValueError("known hashes: fewer literals than unmarked")
            memcpy(dst + 8 * i, rp + 8 * r, 8)
            r += 1
    if f != found or r != others:
        raise ValueError("known hashes: columns left over")
    return out
