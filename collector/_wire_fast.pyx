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
known to be whole. The reads of msgpack's primitives are collector/_msgpack.pxd's, the scan of
an event map collector/_wire_scan.pxd's, the checks of a batch's head, tail and stored fields
collector/_wire_checks.pyx's; this module turns what they read into a `Batch`.
"""

cimport cython
from cpython.array cimport array, clone
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from kvscope.collector._msgpack cimport (
    Reader,
    at,
    read_array,
    read_int64,
    read_nil,
    read_str,
    read_uint64,
)
from kvscope.collector._wire_checks cimport StoredFields, check_stored, read_head, read_tail
from kvscope.collector._wire_scan cimport (
    CLEARED,
    F_GROUP,
    F_HASHES,
    F_LORA_NAME,
    F_MEDIUM,
    F_TOKENS,
    HELD,
    STORED,
    UNREAD,
    Event,
    scan_event,
)

from kvscope.collector import wire_rules
from kvscope.collector.types import AllCleared, Batch, BlocksRemoved, BlocksStored

cdef array _UINT32 = array("I")
assert _UINT32.itemsize == 4

cdef object _table_key = None  # wire.table_key, imported on first use: wire imports this module

# The rules' bounds (collector/wire_rules.py), as C values.
cdef int64_t MAX_GROUP = wire_rules.MAX_GROUP
cdef Py_ssize_t MAX_MEDIUM_BYTES = wire_rules.MAX_MEDIUM_BYTES
cdef Py_ssize_t MAX_LORA_NAME_BYTES = wire_rules.MAX_LORA_NAME_BYTES


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


cdef void _as_word(const uint8_t* raw, Py_ssize_t n, uint64_t* word, uint64_t* mask) noexcept:
    """The first min(n, 8) bytes of `raw` as `same_raw` loads them, and the mask of those bytes
    (in memory order, whatever the byte order)."""
    cdef uint8_t ones[8]
    cdef Py_ssize_t k = n if n < 8 else 8
    word[0] = mask[0] = 0
    memset(ones, 0xFF, 8)
    memcpy(word, raw, k)
    memcpy(mask, ones, k)


@cython.auto_pickle(False)
cdef class _LastKey:
    """The interned table key of the last (medium, group_idx) seen, by their bytes: events
    mostly share one, so most cost neither a str nor a lookup. Kept across batches: table keys
    are interned for good. (Its fields, and `of`, inline, are in _wire_fast.pxd.)"""

    def __cinit__(self):
        self.raw_held = False

    cdef object key_of(self, Reader* r, Event* e):
        """The key of event `e`, or None if its medium or group_idx is of the wrong type (`of`
        first, where the bytes repeat)."""
        global _table_key
        cdef Py_ssize_t medium_at = e.at[F_MEDIUM], group_at = e.at[F_GROUP]
        cdef Reader f = at(r, medium_at)
        cdef const uint8_t* s = NULL
        cdef Py_ssize_t n = -1, raw_medium = -1, raw_group = -1
        cdef int64_t group = 0
        cdef bint group_nil
        cdef object medium, key
        if medium_at >= 0:
            if not read_nil(&f) and (read_str(&f, &s, &n) < 0 or n > MAX_MEDIUM_BYTES):
                return None
            raw_medium = f.pos - medium_at
        f = at(r, group_at)
        group_nil = group_at < 0 or read_nil(&f)
        if not group_nil and (read_int64(&f, &group) < 0 or not 0 <= group <= MAX_GROUP):
            return None
        if group_at >= 0:
            raw_group = f.pos - group_at
        if not (
            self.key is not None
            and group_nil == self.group_nil
            and group == self.group
            and (
                self.medium is None
                if n < 0
                else self.medium is not None
                and n == PyBytes_GET_SIZE(self.medium)
                and same_bytes(s, <const uint8_t*>PyBytes_AS_STRING(self.medium), n)
            )
        ):
            medium = optional_str(r, medium_at, MAX_MEDIUM_BYTES)
            if medium is _BAD:
                return None
            if _table_key is None:
                from kvscope.collector.wire import table_key

                _table_key = table_key
            key = _table_key(medium, None if group_nil else PyLong_FromLongLong(group))
            self.key = None  # while the fields change
            self.raw_held = False
            self.medium = None if n < 0 else PyBytes_FromStringAndSize(<const char*>s, n)
            self.group_nil, self.group = group_nil, group
            self.key = key
        # This key's bytes, for `of` to match the next event's against.
        self.raw_held = raw_medium <= RAW_MEDIUM_CAP and raw_group <= RAW_GROUP_CAP
        if self.raw_held:
            self.raw_medium, self.raw_group = raw_medium, raw_group
            if raw_medium > 0:
                memcpy(self.raw_medium_bytes, r.p + medium_at, raw_medium)
                _as_word(self.raw_medium_bytes, raw_medium, &self.raw_medium_word,
                         &self.raw_medium_mask)
            if raw_group > 0:
                memcpy(self.raw_group_bytes, r.p + group_at, raw_group)
                _as_word(self.raw_group_bytes, raw_group, &self.raw_group_word,
                         &self.raw_group_mask)
        return self.key


cdef _LastKey _last_key = _LastKey()


cdef object stored(Reader* r, Event* e, object key, int64_t max_block_size):
    """The BlocksStored of event `e`, as the slow path builds it; None if a field is off."""
    cdef StoredFields s
    cdef list hashes = []
    cdef object tokens, lora_name
    if check_stored(r, e, max_block_size, &s) < 0:
        return None
    lora_name = optional_str(r, e.at[F_LORA_NAME], MAX_LORA_NAME_BYTES)
    if lora_name is _BAD:
        return None
    take_hashes(r, e, hashes)
    tokens = take_tokens(r, e) if e.at[F_TOKENS] >= 0 else clone(_UINT32, 0, False)
    return BlocksStored(
        hashes,
        PyLong_FromUnsignedLongLong(s.parent) if s.has_parent else None,
        tokens,
        PyLong_FromLongLong(s.block_size),
        key,
        lora_name,
        None,
    )


cdef object decode(Reader* r, object seq, int64_t max_block_size):
    cdef Py_ssize_t n_top, n_events, k
    cdef double ts
    cdef int64_t rank_value
    cdef bint rank_nil
    cdef Event e
    cdef list events = []
    cdef object key, event
    cdef object removal = None  # the last event, when it is a removal: the next may join it
    if read_head(r, &n_top, &ts, &n_events) < 0:
        return None
    for k in range(n_events):
        if scan_event(r, &e, NULL) < 0:
            return None
        if e.kind == CLEARED:
            events.append(AllCleared())
            removal = None
            continue
        key = _last_key.of(r, &e)
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
    if read_tail(r, n_top, &rank_nil, &rank_value) < 0:
        return None
    return Batch(seq, ts, None if rank_nil else PyLong_FromLongLong(rank_value), events, 0, r.end)


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


def _keys_both_ways(payloads):
    """For tests: each event's table key, as `_LastKey.of` finds it and as `key_of` alone does
    (each on a `_LastKey` of its own, kept across `payloads`), and whether `of` matched the
    bytes (no call). A payload's events are scanned up to the first the scan declines."""
    cdef _LastKey fast = _LastKey(), general = _LastKey()
    cdef Reader r
    cdef Py_ssize_t n_top, n_events, k
    cdef double ts
    cdef Event e
    cdef bint matched
    out = []
    for payload in payloads:
        r.p = <const uint8_t*>PyBytes_AS_STRING(payload)
        r.pos, r.end = 0, PyBytes_GET_SIZE(payload)
        if read_head(&r, &n_top, &ts, &n_events) < 0:
            continue
        for k in range(n_events):
            if scan_event(&r, &e, NULL) < 0:
                break
            if e.kind == CLEARED:
                continue
            matched = fast.repeats(&r, &e)
            out.append((fast.of(&r, &e), general.key_of(&r, &e), matched))
    return out
