# The scan of one event map of a map-layout batch, for the compiled decoder
# (collector/_wire_fast.pyx): where each known field's value starts (`Event`), its token ids and
# hashes kept on the way, and its tag. Like the decoder it declines (-1) what it is unsure of.
# Inline, as collector/_msgpack.pxd's reads are: it compiles into the decoder's C module.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from kvscope.collector._msgpack cimport (
    Reader,
    at,
    be16,
    be32,
    be64,
    read_array,
    read_map,
    read_str,
    skip,
)


cdef enum:
    F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM, F_LORA_NAME,
    F_EXTRA_KEYS, F_GROUP, F_CACHE_SALT, N_FIELDS


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


# An event's tail: its keys after its last token_ids or block_hashes value, to the map's end
# (a BlockStored's block_size, lora_id, medium, ...; a BlockRemoved's medium). A publisher sends
# the same tail event after event, so the scan keeps the last one it read (a `TailMemo`) and,
# where the next event's bytes from that point are the same, takes the fields' places from it
# instead of reading them again. What the scan makes of a tail is decided by its bytes, the
# number of keys the map has left where it starts, and the known fields before it (a duplicate
# declines): the memo holds all three, and is taken only where all three are the same. So it
# does not matter which publisher's event put it there.
cdef enum:
    TAIL_CAP = 160  # the longest tail kept (vLLM's are about 100 bytes)
    N_TAILS = 2  # one after token_ids (a BlockStored's), one after block_hashes (a BlockRemoved's)

cdef enum:  # what a tail's fields are to check_stored, found on its first BlockStored
    TAIL_UNJUDGED,
    TAIL_KNOWN,  # they pass, with `block_size` and `extra_keys`
    TAIL_ODD,  # some are before the tail, or one is off: every event checked in full


cdef struct TailMemo:
    Py_ssize_t keys  # the keys the map had left where the tail starts; -1: none kept
    unsigned int seen  # the known fields before it (bit per field)
    unsigned int seen_in  # the known fields in it
    Py_ssize_t size
    int n_fields
    int fields[N_FIELDS]  # the known fields in the tail, and where their values start, from
    Py_ssize_t offsets[N_FIELDS]  # the tail's start
    int judged
    int64_t block_size  # check_stored's, where TAIL_KNOWN
    Py_ssize_t extra_keys  # the nils of its extra_keys, -1 when absent or nil
    uint8_t bytes[TAIL_CAP]


cdef struct Event:
    int kind
    Py_ssize_t at[N_FIELDS]  # where each known field's value starts, -1 when absent
    int tokens_state, hashes_state
    Py_ssize_t n_tokens, n_hashes
    TailMemo* tail  # the memo its tail's fields came from, NULL when they were read
    unsigned int seen  # its known fields (bit per field)
    uint32_t tokens[TOKENS_CAP]
    uint64_t hashes[HASHES_CAP]


cdef inline bint is_(const uint8_t* s, Py_ssize_t n, const char* name,
                     Py_ssize_t size) noexcept nogil:
    return n == size and memcmp(s, name, size) == 0


cdef inline int field_of(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """The known field a key names, or -1 for a key msgspec would skip."""
    # By length first: one compare (a switch) picks the one or few names a key can be, and its
    # first byte the one name of those.
    if n == 4:
        if is_(s, n, b"type", 4): return F_TYPE
    elif n == 9:
        if s[0] == c't':
            if is_(s, n, b"token_ids", 9): return F_TOKENS
        elif s[0] == c'l':
            if is_(s, n, b"lora_name", 9): return F_LORA_NAME
        elif is_(s, n, b"group_idx", 9): return F_GROUP
    elif n == 10:
        if s[0] == c'b':
            if is_(s, n, b"block_size", 10): return F_BLOCK_SIZE
        elif s[0] == c'e':
            if is_(s, n, b"extra_keys", 10): return F_EXTRA_KEYS
        elif is_(s, n, b"cache_salt", 10): return F_CACHE_SALT
    elif n == 12:
        if is_(s, n, b"block_hashes", 12): return F_HASHES
    elif n == 17:
        if is_(s, n, b"parent_block_hash", 17): return F_PARENT
    elif n == 7:
        if is_(s, n, b"lora_id", 7): return F_LORA_ID
    elif n == 6:
        if is_(s, n, b"medium", 6): return F_MEDIUM
    return -1


cdef inline int scan_uints(Reader* r, bint tokens, void* buf, Py_ssize_t cap,
                           Py_ssize_t* count) noexcept nogil:
    """Steps over the value of a token_ids or block_hashes key as skip() does, keeping its items
    in `buf` on the way (each as read_uint64 reads it): HELD, DECLINED or UNREAD, or -1 where
    skip() fails. Anything but an array of ints >= 0 is left to skip(), from the value's start:
    the scan must step over what it steps over (the tag, which decides if the field matters, may
    come later)."""
    cdef Py_ssize_t start = r.pos, n, k = 0, pos, end = r.end, width, run
    cdef uint32_t first
    cdef const uint8_t* p = r.p
    cdef uint8_t b
    cdef uint64_t v
    cdef int state = HELD
    if read_array(r, &n) < 0:
        state = DECLINED
    elif n > cap:
        state = UNREAD
    else:
        # The cursor in locals, not through `r`: the compiler keeps them in registers.
        pos = r.pos
        # The items as senders write them (token ids as fixints, uint8, uint16 or uint32; hashes
        # as uint64) first, in a loop of their own; from the first other one on, the general loop.
        if tokens:
            # In runs of items that fit in what is left even at 5 bytes each (the widest
            # here), so that an item costs no check of the payload's end.
            while k < n:
                run = <Py_ssize_t>(<size_t>(end - pos) // 5)
                if run > n - k:
                    run = n - k
                if run == 0:
                    break
                run += k
                # Two a step while both are uint16s or uint32s (a large vocabulary's ids); the
                # first again below where the second is not.
                while k + 1 < run:
                    b = p[pos]
                    if b == 0xCD:
                        first, width = be16(&p[pos + 1]), 3
                    elif b == 0xCE:
                        first, width = be32(&p[pos + 1]), 5
                    else:
                        break
                    b = p[pos + width]
                    if b == 0xCD:
                        (<uint32_t*>buf)[k + 1] = be16(&p[pos + width + 1])
                        pos += width + 3
                    elif b == 0xCE:
                        (<uint32_t*>buf)[k + 1] = be32(&p[pos + width + 1])
                        pos += width + 5
                    else:
                        break
                    (<uint32_t*>buf)[k] = first
                    k += 2
                while k < run:
                    b = p[pos]
                    if b == 0xCD:
                        (<uint32_t*>buf)[k] = be16(&p[pos + 1])
                        pos += 3
                    elif b == 0xCE:
                        (<uint32_t*>buf)[k] = be32(&p[pos + 1])
                        pos += 5
                    elif b <= 0x7F:
                        (<uint32_t*>buf)[k] = b
                        pos += 1
                    elif b == 0xCC:
                        (<uint32_t*>buf)[k] = p[pos + 1]
                        pos += 2
                    else:
                        break
                    k += 1
                if k < run:
                    break
        else:
            while k < n and end - pos >= 9 and p[pos] == 0xCF:
                (<uint64_t*>buf)[k] = be64(&p[pos + 1])
                pos += 9
                k += 1
        while k < n:
            if pos >= end:
                return -1
            b = p[pos]
            pos += 1
            if b <= 0x7F:
                v = b
            elif 0xCC <= b <= 0xD3:  # uint8..64, int8..64 (one without its sign bit is ours)
                width = 1 << ((b - 0xCC) & 3)
                if end - pos < width:
                    return -1
                v = p[pos]
                if width >= 2:
                    v = (v << 8) | p[pos + 1]
                    if width >= 4:
                        v = (v << 16) | (<uint64_t>p[pos + 2] << 8) | p[pos + 3]
                        if width == 8:
                            v = (
                                (v << 32) | (<uint64_t>p[pos + 4] << 24)
                                | (<uint64_t>p[pos + 5] << 16) | (<uint64_t>p[pos + 6] << 8)
                                | p[pos + 7]
                            )
                pos += width
                if b >= 0xD0 and v >> (8 * width - 1):
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
            k += 1
        r.pos = pos
        if state == HELD:
            count[0] = n
            return HELD
    r.pos = start
    return state if skip(r, 3) == 0 else -1


cdef inline int skip_field(Reader* r) noexcept nogil:
    """skip(r, 3), the values an event's other fields hold (a nil, a short str, an int, a short
    array of nils and small ints: vLLM's extra_keys) stepped over here: a call per field would
    cost more than the step."""
    cdef uint8_t b
    cdef Py_ssize_t n = 0, k, items
    if r.pos < r.end:
        b = r.p[r.pos]
        if b <= 0x7F or b >= 0xE0 or b == 0xC0 or b == 0xC2 or b == 0xC3:
            n = 1
        elif 0xA0 <= b <= 0xBF:
            n = 1 + (b & 0x1F)
        elif 0xCC <= b <= 0xD3:
            n = 1 + (1 << ((b - 0xCC) & 3))
        elif 0x90 <= b <= 0x9F:
            items = b & 0x0F
            if items < r.end - r.pos:
                n = 1 + items
                for k in range(1, n):
                    b = r.p[r.pos + k]
                    if not (b <= 0x7F or b >= 0xE0 or b == 0xC0):
                        n = 0  # something longer: skip's
                        break
        if 0 < n <= r.end - r.pos:
            r.pos += n
            return 0
    return skip(r, 3)


cdef inline bint take_tail(Reader* r, Event* e, TailMemo* tail, Py_ssize_t keys) noexcept nogil:
    """Where the bytes at `r` are `tail`'s, with as many keys left and the same fields before:
    its fields' places noted in `e` and `r` moved past it (True)."""
    cdef int k
    if (
        tail.keys != keys
        or tail.seen != e.seen
        or tail.size > r.end - r.pos
        or memcmp(r.p + r.pos, tail.bytes, tail.size) != 0
    ):
        return False
    for k in range(tail.n_fields):
        e.at[tail.fields[k]] = r.pos + tail.offsets[k]
    e.seen |= tail.seen_in
    r.pos += tail.size
    e.tail = tail
    return True


cdef inline void keep_tail(Reader* r, Event* e, TailMemo* tail, Py_ssize_t start,
                           Py_ssize_t keys, unsigned int seen) noexcept nogil:
    """The tail read from `start` to `r`'s place, kept in `tail` (if it fits)."""
    cdef int f
    cdef Py_ssize_t size = r.pos - start
    if size > TAIL_CAP:
        return
    tail.keys, tail.seen, tail.size, tail.n_fields = keys, seen, size, 0
    tail.seen_in = e.seen & ~seen
    for f in range(N_FIELDS):
        if e.at[f] >= start:
            tail.fields[tail.n_fields] = f
            tail.offsets[tail.n_fields] = e.at[f] - start
            tail.n_fields += 1
    tail.judged = TAIL_UNJUDGED
    memcpy(tail.bytes, r.p + start, size)


cdef inline int scan_event(Reader* r, Event* e, TailMemo* tails) noexcept nogil:
    """Steps over one event map, noting where its known fields are, and reads its tag.
    `tails`: N_TAILS memos of the last tails read (see `TailMemo`), or NULL to read each."""
    cdef Py_ssize_t n, k, size, tail_start = -1, tail_keys = 0
    cdef const uint8_t* s
    cdef uint8_t b
    cdef int f, tail_at = 0
    cdef unsigned int tail_seen = 0
    for f in range(N_FIELDS):
        e.at[f] = -1
    e.tokens_state = e.hashes_state = DECLINED  # (read only when the field is there)
    e.tail = NULL
    e.seen = 0
    if read_map(r, &n) < 0:
        return -1
    for k in range(n):
        # A fixstr key (every known one is) read here; read_str for any other.
        b = r.p[r.pos] if r.pos < r.end else 0
        if (b & 0xE0) == 0xA0:
            size = b & 0x1F
            if size >= r.end - r.pos:
                return -1
            s = r.p + r.pos + 1
            r.pos += 1 + size
        elif read_str(r, &s, &size) < 0:  # msgspec takes only str keys
            return -1
        f = field_of(s, size)
        if f >= 0:
            if (e.seen >> f) & 1:
                return -1  # a duplicate: msgspec keeps the last, we leave it to msgspec
            e.seen |= (<unsigned int>1) << f
            e.at[f] = r.pos
        if f == F_TOKENS or f == F_HASHES:
            if f == F_TOKENS:
                e.tokens_state = scan_uints(r, True, e.tokens, TOKENS_CAP, &e.n_tokens)
                if e.tokens_state < 0:
                    return -1
            else:
                e.hashes_state = scan_uints(r, False, e.hashes, HASHES_CAP, &e.n_hashes)
                if e.hashes_state < 0:
                    return -1
            if tails != NULL:
                tail_at = f == F_HASHES
                if take_tail(r, e, &tails[tail_at], n - 1 - k):
                    break
                tail_start, tail_keys, tail_seen = r.pos, n - 1 - k, e.seen
        elif skip_field(r) < 0:
            return -1
    if tail_start >= 0 and e.tail == NULL:
        keep_tail(r, e, &tails[tail_at], tail_start, tail_keys, tail_seen)
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
