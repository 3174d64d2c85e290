# cython: language_level=3, boundscheck=False, wraparound=False
"""The ingest hot path's decoder: one vLLM >= 0.24 `KVEventBatch` (map layout) straight from its
msgpack bytes to the `Batch` that `wire.BatchDecoder` makes of it, minus msgspec's Python ints.

msgspec builds one Python int per token id (~38 per BlockStored) only for the block table to pack
them into 32 bits again; here token ids go into an `array("I")` as they are read, and the events
are built directly instead of through wire structs.

It accepts only the shape vLLM 0.24 to 0.33 sends: `[ts: float32/64, [event map, ...], rank?]`
(more top-level items are skipped, as msgspec skips them),
events tagged BlockStored / BlockRemoved / AllBlocksCleared, keys in any order, unsigned 64-bit
int hashes, token ids that fit 32 bits, `extra_keys` nil or one nil per hash, and any unknown key
with any value (skipped, as msgspec skips it), every field within the rules of
collector/wire_rules.py (whose constants it reads). Everything else (the old array layout, bytes
or signed hashes, a wrong type, a value a rule refuses, a duplicate key, truncated or trailing
bytes, nesting deeper than MAX_DEPTH) returns None, and the caller decodes the payload the slow
way, which alone decides what is malformed and why. So this module never has to judge an error:
when unsure, it declines; what it accepts, the slow way accepts as the same batch
(tests/test_wire_fast_*.py).

Every read is checked against the payload's end; no Python object is made before a value is
known to be whole.
"""

cimport cython
from cpython.array cimport array, clone
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport fabs
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from kvscope.collector import wire_rules
from kvscope.collector.types import AllCleared, Batch, BlocksRemoved, BlocksStored

# Nesting a skipped value may have; msgspec goes deeper, but deeper is not vLLM: fall back.
cdef int MAX_DEPTH = 64

cdef array _UINT32 = array("I")
assert _UINT32.itemsize == 4

cdef object _table_key = None  # wire.table_key, imported on first use: wire imports this module

# The rules' bounds (collector/wire_rules.py), as C values.
cdef double MAX_ABS_TS = wire_rules.MAX_ABS_TS
cdef int64_t MAX_RANK = wire_rules.MAX_RANK
cdef int64_t MAX_GROUP = wire_rules.MAX_GROUP
cdef Py_ssize_t MAX_MEDIUM_BYTES = wire_rules.MAX_MEDIUM_BYTES
cdef Py_ssize_t MAX_LORA_NAME_BYTES = wire_rules.MAX_LORA_NAME_BYTES


cdef struct Reader:
    const uint8_t* p
    Py_ssize_t pos
    Py_ssize_t end


# --- msgpack primitives: 0 when read, -1 when not there, not of that kind, or cut short --------
cdef inline int read_be(Reader* r, int width, uint64_t* out) noexcept nogil:
    """A big-endian unsigned int of `width` bytes."""
    cdef uint64_t v = 0
    cdef int i
    if r.end - r.pos < width:
        return -1
    for i in range(width):
        v = (v << 8) | r.p[r.pos + i]
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


cdef int skip(Reader* r, int depth) noexcept nogil:
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


# --- events --------------------------------------------------------------------------------------
cdef enum:
    F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM, F_LORA_NAME,
    F_EXTRA_KEYS, F_GROUP, N_FIELDS


cdef inline bint is_(const uint8_t* s, Py_ssize_t n, const char* name,
                     Py_ssize_t size) noexcept nogil:
    return n == size and memcmp(s, name, size) == 0


cdef int field_of(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """The known field a key names, or -1 for a key msgspec would skip."""
    # By length first: one compare (a switch) picks the one or few names a key can be.
    if n == 4:
        if is_(s, n, b"type", 4): return F_TYPE
    elif n == 9:
        if is_(s, n, b"token_ids", 9): return F_TOKENS
        if is_(s, n, b"lora_name", 9): return F_LORA_NAME
        if is_(s, n, b"group_idx", 9): return F_GROUP
    elif n == 10:
        if is_(s, n, b"block_size", 10): return F_BLOCK_SIZE
        if is_(s, n, b"extra_keys", 10): return F_EXTRA_KEYS
    elif n == 12:
        if is_(s, n, b"block_hashes", 12): return F_HASHES
    elif n == 17:
        if is_(s, n, b"parent_block_hash", 17): return F_PARENT
    elif n == 7:
        if is_(s, n, b"lora_id", 7): return F_LORA_ID
    elif n == 6:
        if is_(s, n, b"medium", 6): return F_MEDIUM
    return -1


cdef enum:
    STORED, REMOVED, CLEARED


# token_ids and block_hashes are read once, by the scan, into the event's buffers; an array
# longer than its buffer (none in vLLM's usual chunks) is stepped over and read where it is used.
cdef enum:
    TOKENS_CAP = 2048
    HASHES_CAP = 256

cdef enum:  # what the scan made of a token_ids or block_hashes value
    HELD,  # its items are in the event's buffer
    DECLINED,  # not an array of ints >= 0 (token ids: that fit 32 bits): not ours, if it counts
    UNREAD,  # longer than the buffer: read at `at`


cdef struct Event:
    int kind
    Py_ssize_t at[N_FIELDS]  # where each known field's value starts, -1 when absent
    int tokens_state, hashes_state
    Py_ssize_t n_tokens, n_hashes
    uint32_t tokens[TOKENS_CAP]
    uint64_t hashes[HASHES_CAP]


cdef inline int scan_uints(Reader* r, bint tokens, void* buf, Py_ssize_t cap,
                           Py_ssize_t* count) noexcept nogil:
    """Steps over the value of a token_ids or block_hashes key as skip() does, keeping its items
    in `buf` on the way (each as read_uint64 reads it): HELD, DECLINED or UNREAD, or -1 where
    skip() fails. Anything but an array of ints >= 0 is left to skip(), from the value's start:
    the scan must step over what it steps over (the tag, which decides if the field matters, may
    come later)."""
    cdef Py_ssize_t start = r.pos, n, k
    cdef uint8_t b
    cdef uint64_t v
    cdef int state = HELD
    if read_array(r, &n) < 0:
        state = DECLINED
    elif n > cap:
        state = UNREAD
    else:
        for k in range(n):
            if r.pos >= r.end:
                return -1
            b = r.p[r.pos]
            r.pos += 1
            # A constant width per branch: each read_be unrolls.
            if b <= 0x7F:
                v = b
            elif b == 0xCC:
                if read_be(r, 1, &v) < 0:
                    return -1
            elif b == 0xCD:
                if read_be(r, 2, &v) < 0:
                    return -1
            elif b == 0xCE:
                if read_be(r, 4, &v) < 0:
                    return -1
            elif b == 0xCF:
                if read_be(r, 8, &v) < 0:
                    return -1
            elif 0xD0 <= b <= 0xD3:  # int8..int64: read_uint64 takes one without its sign bit
                if read_be(r, 1 << (b - 0xD0), &v) < 0:
                    return -1
                if v >> ((8 << (b - 0xD0)) - 1):
                    state = DECLINED
                    break
            else:
                state = DECLINED
                break
            if tokens:
                if v >> 32:  # (a literal 0xFFFFFFFF here is a Python int)
                    state = DECLINED
                    break
                (<uint32_t*>buf)[k] = <uint32_t>v
            else:
                (<uint64_t*>buf)[k] = v
        if state == HELD:
            count[0] = n
            return HELD
    r.pos = start
    return state if skip(r, 3) == 0 else -1


cdef int scan_event(Reader* r, Event* e) noexcept nogil:
    """Steps over one event map, noting where its known fields are, and reads its tag."""
    cdef Py_ssize_t n, k, size
    cdef const uint8_t* s
    cdef int f
    for f in range(N_FIELDS):
        e.at[f] = -1
    e.tokens_state = e.hashes_state = DECLINED  # (read only when the field is there)
    if read_map(r, &n) < 0:
        return -1
    for k in range(n):
        if read_str(r, &s, &size) < 0:  # msgspec takes only str keys
            return -1
        f = field_of(s, size)
        if f >= 0:
            if e.at[f] >= 0:
                return -1  # a duplicate: msgspec keeps the last, we leave it to msgspec
            e.at[f] = r.pos
        if f == F_TOKENS:
            e.tokens_state = scan_uints(r, True, e.tokens, TOKENS_CAP, &e.n_tokens)
            if e.tokens_state < 0:
                return -1
        elif f == F_HASHES:
            e.hashes_state = scan_uints(r, False, e.hashes, HASHES_CAP, &e.n_hashes)
            if e.hashes_state < 0:
                return -1
        elif skip(r, 3) < 0:
            return -1
    if e.at[F_TYPE] < 0:
        return -1
    cdef Reader tag = at(r, e.at[F_TYPE])
    if read_str(&tag, &s, &size) < 0:
        return -1
    if is_(s, size, b"BlockStored", 11):
        e.kind = STORED
    elif is_(s, size, b"BlockRemoved", 12):
        e.kind = REMOVED
    elif is_(s, size, b"AllBlocksCleared", 16):
        e.kind = CLEARED
    else:
        return -1
    return 0 if e.kind == CLEARED or e.at[F_HASHES] >= 0 else -1


cdef inline Reader at(Reader* r, Py_ssize_t pos) noexcept nogil:
    cdef Reader field = r[0]
    field.pos = pos
    return field


cdef int read_hashes(Reader* r, Py_ssize_t pos, list out) except -2:
    """Appends the hashes at `pos` to `out`: 0, or -1 if one is not an unsigned 64-bit int."""
    cdef Reader f = at(r, pos)
    cdef Py_ssize_t n, k
    cdef uint64_t h
    if read_array(&f, &n) < 0:
        return -1
    for k in range(n):
        if read_uint64(&f, &h) < 0:
            return -1
        out.append(PyLong_FromUnsignedLongLong(h))
    return 0


cdef object read_tokens(Reader* r, Py_ssize_t pos):
    """The token ids at `pos` as an array("I"), or None if one does not fit 32 bits."""
    cdef Reader f = at(r, pos)
    cdef Py_ssize_t n, k
    cdef uint64_t t
    if read_array(&f, &n) < 0:
        return None
    cdef array tokens = clone(_UINT32, n, False)
    cdef unsigned int* data = tokens.data.as_uints
    for k in range(n):
        if read_uint64(&f, &t) < 0 or t >> 32:  # (a literal 0xFFFFFFFF here is a Python int)
            return None
        data[k] = <unsigned int>t
    return tokens


cdef int take_hashes(Reader* r, Event* e, list out) except -2:
    """Appends event `e`'s hashes to `out`: 0, or -1 if one is not an unsigned 64-bit int."""
    cdef Py_ssize_t k
    if e.hashes_state == HELD:
        for k in range(e.n_hashes):
            out.append(PyLong_FromUnsignedLongLong(e.hashes[k]))
        return 0
    if e.hashes_state == UNREAD:
        return read_hashes(r, e.at[F_HASHES], out)
    return -1


cdef object take_tokens(Reader* r, Event* e):
    """Event `e`'s token ids as an array("I"), or None if one does not fit 32 bits."""
    cdef array tokens
    if e.tokens_state == HELD:
        tokens = clone(_UINT32, e.n_tokens, False)
        memcpy(tokens.data.as_uints, e.tokens, e.n_tokens * sizeof(uint32_t))
        return tokens
    if e.tokens_state == UNREAD:
        return read_tokens(r, e.at[F_TOKENS])
    return None


cdef inline int check_optional_int(Reader* r, Py_ssize_t pos, int64_t* out,
                                   bint* nil) noexcept nogil:
    """An `int | None` field (absent is None); 0 when it is one."""
    cdef Reader f = at(r, pos)
    nil[0] = pos < 0 or read_nil(&f)
    if nil[0]:
        return 0
    return read_int64(&f, out)


cdef object _BAD = object()  # what `optional_str` returns for a value that is no `str | None`


cdef object optional_str(Reader* r, Py_ssize_t pos, Py_ssize_t max_bytes):
    """A `str | None` field (absent is None), or _BAD if it is neither, not UTF-8, or longer
    than `max_bytes`."""
    cdef Reader f = at(r, pos)
    cdef const uint8_t* s
    cdef Py_ssize_t n
    if pos < 0 or read_nil(&f):
        return None
    if read_str(&f, &s, &n) < 0 or n > max_bytes:
        return _BAD
    try:
        return PyUnicode_DecodeUTF8(<const char*>s, n, "strict")
    except UnicodeDecodeError:
        return _BAD


cdef int check_stored_extras(Reader* r, Event* e, Py_ssize_t n_hashes) noexcept nogil:
    """The fields of a BlockStored that only need checking: lora_id is an int or nil, extra_keys
    nil or a nil per hash (what the rules reduce to None; other extra keys are the slow path's)."""
    cdef Reader f
    cdef Py_ssize_t n, k
    cdef int64_t i
    cdef uint64_t u
    cdef bint unsigned
    if e.at[F_LORA_ID] >= 0:
        f = at(r, e.at[F_LORA_ID])
        if not read_nil(&f) and read_int(&f, &i, &u, &unsigned) < 0:
            return -1
    if e.at[F_EXTRA_KEYS] >= 0:
        f = at(r, e.at[F_EXTRA_KEYS])
        if not read_nil(&f):
            if read_array(&f, &n) < 0 or n != n_hashes:
                return -1
            for k in range(n):
                if not read_nil(&f):
                    return -1
    return 0


@cython.auto_pickle(False)
cdef class _LastKey:
    """The interned table key of the last (medium, group_idx) seen, by their bytes: events
    mostly share one, so most cost neither a str nor a lookup. Kept across batches: table keys
    are interned for good."""

    cdef bytes medium  # None: nil
    cdef bint group_nil
    cdef int64_t group
    cdef object key

    cdef object key_of(self, Reader* r, Event* e):
        """The key of event `e`, or None if its medium or group_idx is of the wrong type."""
        global _table_key
        cdef Reader f = at(r, e.at[F_MEDIUM])
        cdef const uint8_t* s = NULL
        cdef Py_ssize_t n = -1
        cdef int64_t group = 0
        cdef bint group_nil
        cdef object medium
        if e.at[F_MEDIUM] >= 0 and not read_nil(&f) and (
            read_str(&f, &s, &n) < 0 or n > MAX_MEDIUM_BYTES
        ):
            return None
        if check_optional_int(r, e.at[F_GROUP], &group, &group_nil) < 0:
            return None
        if not group_nil and not 0 <= group <= MAX_GROUP:
            return None
        if (
            self.key is not None
            and group_nil == self.group_nil
            and group == self.group
            and (
                self.medium is None
                if n < 0
                else self.medium is not None
                and n == PyBytes_GET_SIZE(self.medium)
                and memcmp(s, PyBytes_AS_STRING(self.medium), n) == 0
            )
        ):
            return self.key
        medium = optional_str(r, e.at[F_MEDIUM], MAX_MEDIUM_BYTES)
        if medium is _BAD:
            return None
        if _table_key is None:
            from kvscope.collector.wire import table_key

            _table_key = table_key
        key = _table_key(medium, None if group_nil else PyLong_FromLongLong(group))
        self.key = None  # while the fields change
        self.medium = None if n < 0 else PyBytes_FromStringAndSize(<const char*>s, n)
        self.group_nil, self.group = group_nil, group
        self.key = key
        return key


cdef _LastKey _last_key = _LastKey()


cdef object stored(Reader* r, Event* e, object key, int64_t max_block_size):
    """The BlocksStored of event `e`, as the slow path builds it; None if a field is off."""
    cdef list hashes = []
    cdef uint64_t parent_hash
    cdef int64_t block_size = 0
    cdef Py_ssize_t n, n_tokens, span
    cdef Reader f
    cdef object parent = None, tokens, lora_name
    if take_hashes(r, e, hashes) < 0:
        return None
    n = len(hashes)
    if check_stored_extras(r, e, n) < 0:
        return None
    if e.at[F_PARENT] >= 0:
        f = at(r, e.at[F_PARENT])
        if not read_nil(&f):
            if read_uint64(&f, &parent_hash) < 0:
                return None
            parent = PyLong_FromUnsignedLongLong(parent_hash)
    if e.at[F_BLOCK_SIZE] >= 0:
        f = at(r, e.at[F_BLOCK_SIZE])
        if read_int64(&f, &block_size) < 0 or not 0 <= block_size <= max_block_size:
            return None
    if e.at[F_TOKENS] >= 0:
        tokens = take_tokens(r, e)
        if tokens is None:
            return None
    else:
        tokens = clone(_UINT32, 0, False)
    # As many token ids as the blocks hold: none, block_size per hash, or whole blocks more
    # (wire_rules.token_ids_of).
    n_tokens, span = len(tokens), block_size * n
    if n_tokens and n_tokens != span and not (
        block_size and n_tokens % block_size == 0 and n_tokens > span
    ):
        return None
    lora_name = optional_str(r, e.at[F_LORA_NAME], MAX_LORA_NAME_BYTES)
    if lora_name is _BAD:
        return None
    return BlocksStored(
        hashes, parent, tokens, PyLong_FromLongLong(block_size), key, lora_name, None
    )


cdef object decode(Reader* r, object seq, int64_t max_block_size):
    cdef Py_ssize_t n_top, n_events, k
    cdef double ts
    cdef int64_t rank_value
    cdef Event e
    cdef list events = []
    cdef object rank = None, key, event
    cdef object removal = None  # the last event, when it is a removal: the next may join it
    if read_array(r, &n_top) < 0 or n_top < 2:
        return None
    # NaN fails the comparison too
    if read_float(r, &ts) < 0 or not fabs(ts) <= MAX_ABS_TS or read_array(r, &n_events) < 0:
        return None
    for k in range(n_events):
        if scan_event(r, &e) < 0:
            return None
        if e.kind == CLEARED:
            events.append(AllCleared())
            removal = None
            continue
        key = _last_key.key_of(r, &e)
        if key is None:
            return None
        if e.kind == STORED:
            event = stored(r, &e, key, max_block_size)
            if event is None:
                return None
            events.append(event)
            removal = None
        elif removal is not None and (removal.table is key or removal.table == key):
            # Consecutive removals from one table are one event, as the slow path makes them
            # (keys are interned, but a hostile publisher's past MAX_INTERNED_KEYS are not).
            if take_hashes(r, &e, removal.hashes) < 0:
                return None
        else:
            removal = BlocksRemoved([], key)
            if take_hashes(r, &e, removal.hashes) < 0:
                return None
            events.append(removal)
    if n_top >= 3 and not read_nil(r):
        if read_int64(r, &rank_value) < 0 or not 0 <= rank_value <= MAX_RANK:
            return None
        rank = PyLong_FromLongLong(rank_value)
    for k in range(n_top - 3):  # fields of a later vLLM: msgspec skips them too
        if skip(r, 1) < 0:
            return None
    if r.pos != r.end:
        return None  # trailing bytes
    return Batch(seq, ts, rank, events, 0, r.end)


def decode_map_batch(payload, seq, int64_t max_block_size):
    """The Batch of a vLLM >= 0.24 map-layout payload, or None: decode it the slow way.
    `max_block_size`: `IngestLimits.max_block_size`."""
    if type(payload) is not bytes:
        return None
    cdef Reader r
    r.p = <const uint8_t*>PyBytes_AS_STRING(payload)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(payload)
    return decode(&r, seq, max_block_size)
