# cython: language_level=3, boundscheck=False, wraparound=False
"""The first pass of collector/_replay.pyx's `FusedApply` over a batch's msgpack bytes: the whole
batch checked as the compiled decoder (collector/_wire_fast.pyx, its checks shared through
_wire_checks.pxd) checks it, its events kept as `Op`s, their hashes and tokens as C values in
scratch buffers reused from batch to batch (the second pass, the apply, is _replay.pyx's)."""

cimport cython
from cpython.array cimport array, clone
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from kvscope.collector._msgpack cimport Reader, at, read_array, read_nil, read_uint64
from kvscope.collector._wire_checks cimport (
    StoredFields,
    check_stored,
    read_head,
    read_tail,
    stored_counts,
    stored_fit,
    stored_fixed,
)
from kvscope.collector._wire_fast cimport _LastKey
from kvscope.collector._wire_scan cimport (
    CLEARED,
    F_BLOCK_SIZE,
    F_CACHE_SALT,
    F_EXTRA_KEYS,
    F_HASHES,
    F_LORA_ID,
    F_LORA_NAME,
    F_TOKENS,
    HELD,
    N_TAILS,
    STORED,
    TAIL_KNOWN,
    TAIL_ODD,
    TAIL_UNJUDGED,
    UNREAD,
    Event,
    TailMemo,
    scan_event,
)

from kvscope.collector.types import AllCleared, Batch, BlocksRemoved, BlocksStored

cdef array _UINT32 = array("I")


cdef inline int _reserve(void** buf, Py_ssize_t* cap, Py_ssize_t need, size_t item) except -1:
    """Room for `need` items of `item` bytes in `buf` (grown by doubling)."""
    if need > cap[0]:
        _grow(buf, cap, need, item)
    return 0


cdef int _grow(void** buf, Py_ssize_t* cap, Py_ssize_t need, size_t item) except -1:
    cdef Py_ssize_t grown = max(need, 2 * cap[0], 64)
    cdef void* more = PyMem_Realloc(buf[0], grown * item)
    if more == NULL:
        raise MemoryError()
    buf[0], cap[0] = more, grown
    return 0


# The first pass's steps, inline in it (functions, not methods: no call through the vtable
# per event).
cdef inline Op* add_op(BatchRead self, int kind, Py_ssize_t key) except NULL:
    _reserve(<void**>&self.ops, &self.ops_cap, self.n_ops + 1, sizeof(Op))
    cdef Op* op = &self.ops[self.n_ops]
    self.n_ops += 1
    op.kind, op.key, op.hashes, op.n_hashes, op.tokens = kind, key, self.n_hashes, 0, -1
    op.n_tokens, op.with_tokens = 0, False
    return op


cdef inline int take_hashes(BatchRead self, Reader* r, Event* e, Op* op) except -2:
    """Appends event `e`'s hashes to `op`'s: 0, or -1 if one is not an unsigned 64-bit int."""
    cdef Reader f
    cdef Py_ssize_t n, k
    if e.hashes_state == HELD:
        n = e.n_hashes
        _reserve(<void**>&self.hashes, &self.hashes_cap, self.n_hashes + n, 8)
        memcpy(&self.hashes[self.n_hashes], e.hashes, n * 8)
    elif e.hashes_state == UNREAD:  # longer than the scan's buffer
        f = at(r, e.at[F_HASHES])
        if read_array(&f, &n) < 0:
            return -1
        _reserve(<void**>&self.hashes, &self.hashes_cap, self.n_hashes + n, 8)
        for k in range(n):
            if read_uint64(&f, &self.hashes[self.n_hashes + k]) < 0:
                return -1
    else:
        return -1
    self.n_hashes += n
    op.n_hashes += n
    return 0


cdef inline int take_tokens(BatchRead self, Reader* r, Event* e, Op* op,
                            Py_ssize_t n) except -1:
    """Keeps the `n` token ids of `e` (checked by check_stored) for `op`."""
    cdef Reader f
    cdef Py_ssize_t k, length
    cdef uint64_t t = 0
    _reserve(<void**>&self.tokens, &self.tokens_cap, self.n_tokens + n, 4)
    if e.tokens_state == HELD:
        memcpy(&self.tokens[self.n_tokens], e.tokens, n * 4)
    else:
        f = at(r, e.at[F_TOKENS])
        read_array(&f, &length)
        for k in range(n):
            read_uint64(&f, &t)
            self.tokens[self.n_tokens + k] = <uint32_t>t
    op.tokens, op.n_tokens = self.n_tokens, n
    self.n_tokens += n
    return 0


# The fields of a BlockStored that `stored_fixed` checks, and lora_name: where none is before an
# event's tail, the tail's bytes decide them all.
cdef unsigned int FIXED_FIELDS = (
    (1 << F_LORA_ID) | (1 << F_EXTRA_KEYS) | (1 << F_BLOCK_SIZE) | (1 << F_CACHE_SALT)
    | (1 << F_LORA_NAME)
)


cdef inline bint no_lora_name(Reader* r, Event* e) noexcept nogil:
    """Whether `e` has no LoRA name (absent or nil): one is kept aside per block, the usual
    way's work."""
    cdef Reader f = at(r, e.at[F_LORA_NAME])
    return e.at[F_LORA_NAME] < 0 or read_nil(&f)


cdef inline void judge_tail(Reader* r, Event* e, TailMemo* tail) noexcept nogil:
    """What `tail`'s fields are to check_stored, from BlockStored `e` whose tail it is: known
    (they pass: their block_size and extra_keys kept) where they are all in it, else odd."""
    tail.judged = TAIL_ODD
    if tail.seen & FIXED_FIELDS:
        return
    if stored_fixed(r, e, &tail.block_size, &tail.extra_keys) < 0 or not no_lora_name(r, e):
        return
    tail.judged = TAIL_KNOWN


cdef inline int check_fused(Reader* r, Event* e, int64_t max_block_size,
                            StoredFields* s) noexcept nogil:
    """check_stored of BlockStored `e`, and no LoRA name: 0, or -1 to decline. Where its tail
    came from a memo, the fields in it are as the memo's verdict has them."""
    cdef TailMemo* tail = e.tail
    if tail != NULL:
        if tail.judged == TAIL_UNJUDGED:
            judge_tail(r, e, tail)
        if tail.judged == TAIL_KNOWN:
            if stored_counts(r, e, s) < 0:
                return -1
            s.block_size = tail.block_size
            return stored_fit(s, max_block_size, tail.extra_keys)
    if check_stored(r, e, max_block_size, s) < 0 or not no_lora_name(r, e):
        return -1
    return 0


@cython.auto_pickle(False)
cdef class BatchRead:
    """One batch at a time, as the first pass read it (see _fused_read.pxd)."""

    def __cinit__(self):
        cdef int k
        self.last_key = _LastKey()
        self.keys = []
        for k in range(N_TAILS):
            self.tails[k].keys = -1  # none kept

    def __dealloc__(self):
        PyMem_Free(self.ops)
        PyMem_Free(self.hashes)
        PyMem_Free(self.tokens)

    # --- the first pass: the whole batch checked, its values kept ------------------------------
    cdef int read(self, bytes payload, double* ts) except -2:
        """The first pass: 0 when the batch is the compiled decoder's, with no LoRA name; -1
        to leave it to decode + apply."""
        cdef Reader r, f
        cdef Event* e = &self.event
        cdef StoredFields s
        cdef Py_ssize_t n_top, n_events, k, last_removal = -1
        cdef Op* op
        cdef list keys = self.keys
        cdef object key, last = None
        r.p = <const uint8_t*>PyBytes_AS_STRING(payload)
        r.pos, r.end = 0, PyBytes_GET_SIZE(payload)
        self.n_ops = self.n_hashes = self.n_tokens = self.n_keys = 0
        self.has_clear = False
        if read_head(&r, &n_top, ts, &n_events) < 0:
            return -1
        for k in range(n_events):
            if scan_event(&r, e, self.tails) < 0:
                return -1
            if e.kind == CLEARED:
                add_op(self, CLEARED, -1)
                self.has_clear = True
                last_removal = -1
                continue
            key = self.last_key.of(&r, e)
            if key is None:
                return -1
            if key is not last:
                if self.n_keys < len(keys):
                    keys[self.n_keys] = key
                else:
                    keys.append(key)
                self.n_keys += 1
                last = key
            if e.kind == STORED:
                last_removal = -1
                if check_fused(&r, e, self.max_block_size, &s) < 0:
                    return -1
                op = add_op(self, STORED, self.n_keys - 1)
                op.has_parent, op.parent, op.block_size = s.has_parent, s.parent, s.block_size
                take_hashes(self, &r, e, op)
                # No token_ids key and no hashes also passes the count (0 == 0): reading the
                # absent key would read before the payload.
                if e.at[F_TOKENS] >= 0:
                    take_tokens(self, &r, e, op, s.n_tokens)  # (all: `batch` holds them)
                    op.with_tokens = s.block_size and s.n_tokens == s.n_hashes * s.block_size
                continue
            # Consecutive removals from one table are one event, as the decoders make them.
            if last_removal < 0 or not (
                keys[self.ops[last_removal].key] is key or keys[self.ops[last_removal].key] == key
            ):
                last_removal = self.n_ops
                add_op(self, e.kind, self.n_keys - 1)
            if take_hashes(self, &r, e, &self.ops[last_removal]) < 0:
                return -1
        return read_tail(&r, n_top, &self.rank_nil, &self.rank_value)

    cdef object built(self, object payload, object seq, double ts):
        """The `Batch` that `decode_map_batch` makes of `payload` read last, built from its
        read."""
        cdef list events = [], hashes
        cdef Py_ssize_t i, k
        cdef Op* op
        cdef array tokens
        for i in range(self.n_ops):
            op = &self.ops[i]
            if op.kind == CLEARED:
                events.append(AllCleared())
                continue
            hashes = [PyLong_FromUnsignedLongLong(self.hashes[k])
                      for k in range(op.hashes, op.hashes + op.n_hashes)]
            if op.kind != STORED:
                events.append(BlocksRemoved(hashes, self.keys[op.key]))
                continue
            tokens = clone(_UINT32, op.n_tokens if op.tokens >= 0 else 0, False)
            if op.tokens >= 0:
                memcpy(tokens.data.as_uints, &self.tokens[op.tokens], op.n_tokens * 4)
            events.append(BlocksStored(
                hashes,
                PyLong_FromUnsignedLongLong(op.parent) if op.has_parent else None,
                tokens,
                PyLong_FromLongLong(op.block_size),
                self.keys[op.key],
                None,
                None,
            ))
        return Batch(
            seq,
            ts,
            None if self.rank_nil else PyLong_FromLongLong(self.rank_value),
            events,
            0,
            PyBytes_GET_SIZE(payload),
        )
