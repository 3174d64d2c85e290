# The walks of the log's format 3 columns (storage/_log_columns.pyx): a chunk's payloads into
# the columns and back, without the GIL. All inline: they compile into the module that cimports
# them.
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset

from kvscope.storage._log_buf cimport Buf, get_varint, grow_nogil, put_nogil, put_varint_nogil
from kvscope.storage._log_split cimport Hashes, hashes_note
from kvscope.storage._msgpack_widths cimport kvscope_column_span
from kvscope.storage._granules cimport (
    GRANULE_IDS, Granules, granules_join, granules_put, ids_bytes
)
from kvscope.storage._log_fold cimport TRACK_DEPTH, Fold, Track, ids_noted, map_kids


cdef enum:
    MARK = 0xC1


cdef inline Py_ssize_t be(const uint8_t* p, int width) noexcept nogil:
    cdef Py_ssize_t v = 0
    cdef int i
    for i in range(width):
        v = (v << 8) | p[i]
    return v


cdef inline Py_ssize_t token(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                      Py_ssize_t* items) noexcept nogil:
    """Bytes of the token at `pos` that stay together (a scalar whole, a container's header);
    `items`: an array's length, else -1. -1 if cut short or not msgpack. Never an 8-byte int
    or float's (the walks take those before)."""
    cdef uint8_t b = p[pos]
    cdef Py_ssize_t n = kvscope_column_span[b], w
    items[0] = -1
    if n:  # nearly every token: a load, not a branch per format
        return n if n <= end - pos else -1
    # The others: an array's header, a length and its body, a map16/32's header, 0xC1.
    if 0x90 <= b <= 0x9F:
        items[0] = b & 0x0F
        n = 1
    elif b == 0xC1:
        return -1
    elif b <= 0xC9 or 0xD9 <= b <= 0xDB:  # bin, ext, str: a length, then the body
        w = 1 << ((b - 0xC4) if b <= 0xC6 else (b - 0xC7) if b <= 0xC9 else (b - 0xD9))
        if end - pos < 1 + w:
            return -1
        n = 1 + w + be(p + pos + 1, <int>w) + (1 if 0xC7 <= b <= 0xC9 else 0)
    else:  # array16/32, map16/32
        w = 2 if b == 0xDC or b == 0xDE else 4
        if end - pos < 1 + w:
            return -1
        if b <= 0xDD:
            items[0] = be(p + pos + 1, <int>w)
        n = 1 + w
    if n > end - pos:
        return -1
    return n


cdef inline void closed_to(Py_ssize_t left, Py_ssize_t* depth, Py_ssize_t* close,
                           const Py_ssize_t* marks) noexcept nogil:
    """`split_one`'s note tracking past a value: each container that ends with it closed (the
    counts are `split_one`'s locals, which this inlines over)."""
    while left == close[0]:
        depth[0] -= 1
        close[0] = marks[depth[0]]


cdef inline int split_one(const uint8_t* p, Py_ssize_t end, Buf* skel, Buf* refs, Buf* lits,
                   Buf* floats, Buf* toks, Hashes* h, uint8_t* prev_float, const Granules* g,
                   Buf* grefs, Track* t) noexcept nogil:
    """One payload into the columns (a token run's granules into `grefs` where `g` is
    given: format 4): 0, -1 if it is not msgpack the walk reads whole, -2 if memory ran
    out; 1 where it read it whole but took a
    path other than the plain ones (a token kept whole by its first byte, an 8-byte int or
    float, an array's or a map's header and an array's token run): the packing checks only the
    chunks that hold such a payload (storage/_log_run.pxd). With `t` (NULL: none), the payload
    is noted as well: its token runs' granules kept for the note (storage/_log_fold.pxd),
    `t.odd` set where the note may read it otherwise."""
    # The payload's bytes that go to the skeleton as they are go a run at a time, from `run`
    # (a hash's or a float's first byte with the run before it), as `join_one` gives them back.
    cdef Py_ssize_t pos = 0, n, items, k, run = 0, kids = 0
    # The note's tracking, in locals where `t` is given: the values of the first value left
    # to read, the containers open, and the `left` at which the innermost closes (-1: none).
    cdef Py_ssize_t left = 1, depth = 0, close = -1
    cdef int plain = 0  # 1: a path other than the plain ones taken
    cdef uint64_t v
    cdef uint8_t b
    cdef uint8_t x[8]
    while pos < end:
        b = p[pos]
        n = kvscope_column_span[b]
        if n != 0 and t == NULL:
            # Nearly every token: to the skeleton as it lies, with the run it is part of; those
            # that follow it stepped over in a loop of their own (one past the end: cut short).
            pos += n
            while pos < end:
                n = kvscope_column_span[p[pos]]
                if n == 0:
                    break
                pos += n
            if pos > end:
                return -1
            continue
        if b == 0xCF or b == 0xD3 or b == 0xCB:
            if end - pos < 9:
                return -1
            if t != NULL:
                if left == 0 or (
                    b != 0xCB and (p[pos + 1] | p[pos + 2] | p[pos + 3] | p[pos + 4]) == 0
                ):
                    # A value after the first, or an id the note's reader takes for a token
                    # id where an array holds only such
                    t.odd = True
                    t = NULL
                else:
                    left -= 1
                    closed_to(left, &depth, &close, t.marks)
            if put_nogil(skel, p + run, pos + 1 - run) < 0:
                return -2
            if b == 0xCB:
                for k in range(8):
                    x[k] = p[pos + 1 + k] ^ prev_float[k]
                    prev_float[k] = p[pos + 1 + k]
                if put_nogil(floats, x, 8) < 0:
                    return -2
            else:
                memcpy(&v, p + pos + 1, 8)
                k = hashes_note(h, v)
                if k < 0 or put_varint_nogil(refs, <uint64_t>k) < 0:
                    return -2
                if k == 0 and put_nogil(lits, p + pos + 1, 8) < 0:
                    return -2
            pos += 9
            run = pos
            continue
        if (b & 0xF0) == 0x90:  # a fixarray's header: `token`'s reading, without its tests
            items = b & 0x0F
            n = 1
        else:
            n = token(p, pos, end, &items)
            if n < 0:
                return -1
            if 0xC4 <= b <= 0xDB and kvscope_column_span[b] == 0:
                plain = 1  # a length and a body: bin, ext, str8/16/32
        if t != NULL:
            kids = items
            if items < 0:
                kids = 2 * (b & 0x0F) if (b & 0xF0) == 0x80 else (
                    map_kids(p + pos, n) if (b & 0xFE) == 0xDE else 0
                )
        pos += n
        if items > 0:
            if t != NULL and items >= GRANULE_IDS:
                n = ids_noted(p + pos, end - pos, items, t.grans)
                if n == -2:
                    return -2
            else:
                n = ids_bytes(p + pos, end - pos, items)
            if n > 0:
                kids = 0  # read whole: the note reads no value in it
                if put_nogil(skel, p + run, pos - run) < 0 or grow_nogil(skel, 1) < 0:
                    return -2
                skel.p[skel.n] = MARK
                skel.n += 1
                if g != NULL:
                    if granules_put(g, p + pos, n, items, toks, grefs) < 0:
                        return -2
                elif put_nogil(toks, p + pos, n) < 0:
                    return -2
                pos += n
                run = pos
        if t != NULL:
            if left == 0 or (kids != 0 and depth == TRACK_DEPTH):
                t.odd = True  # a value after the first, or nesting near the note's limit
                t = NULL
            else:
                left -= 1
                if kids != 0:
                    t.marks[depth] = close
                    depth += 1
                    close = left
                    left += kids
                else:
                    closed_to(left, &depth, &close, t.marks)
    if t != NULL and left != 0:
        t.odd = True  # the first value is cut short: the note stops where it does
    return -2 if put_nogil(skel, p + run, pos - run) < 0 else plain


cdef inline int split_all(const uint8_t** ptrs, Py_ssize_t* lens, Py_ssize_t count, bint verbatim,
                   Buf* sizes, Buf** bufs, Hashes* h, Py_ssize_t* kept, Py_ssize_t* odd,
                   const Granules* g, const Fold* f) noexcept nogil:
    """Every payload into the columns (`bufs`: skeleton, references, literals, floats,
    tokens, granules: `split_one`'s); -1 if memory ran out.
    `odd` counts the payloads read whole by a path other than `split_one`'s plain ones. With
    `f` (NULL: none), the payloads its note job notes are noted in the walk where they can be
    (storage/_log_fold.pxd), their granules put in the job's."""
    cdef uint8_t prev_float[8]
    cdef uint8_t saved[8]
    cdef Py_ssize_t marks[6]
    cdef Py_ssize_t hn, k, n, m = -1
    cdef int i, done
    cdef Track track
    cdef Track* t
    memset(prev_float, 0, 8)
    for k in range(count):
        n = lens[k]
        for i in range(6):
            marks[i] = bufs[i].n
        hn = h.n
        memcpy(saved, prev_float, 8)
        t = NULL
        if f != NULL and not verbatim and (f.first + k) % f.step == 0:
            m = (f.first + k) // f.step
            f.job.at[m] = f.job.grans.n
            track.odd = False
            track.grans = &f.job.grans
            t = &track
        done = -1 if verbatim else split_one(ptrs[k], n, bufs[0], bufs[1], bufs[2], bufs[3],
                                             bufs[4], h, prev_float, g, bufs[5], t)
        if done == -2:
            return -1
        if done == 1:
            odd[0] += 1
            done = 0
        if t != NULL:
            if done == 0 and not track.odd:
                f.job.upto[m] = f.job.grans.n
            else:  # the note walks it
                f.job.grans.n = f.job.at[m]
        if done < 0:
            for i in range(6):
                bufs[i].n = marks[i]
            h.n = hn
            memcpy(prev_float, saved, 8)
            if put_nogil(bufs[0], ptrs[k], n) < 0:
                return -1
            if put_varint_nogil(sizes, (<uint64_t>n << 1) | 1) < 0:
                return -1
            kept[0] += 1
        elif put_varint_nogil(sizes, <uint64_t>(bufs[0].n - marks[0]) << 1) < 0:
            return -1
    return 0


cdef inline int join_one(const uint8_t* s, Py_ssize_t pos, Py_ssize_t end, Buf* out,
                  const uint8_t* refs, Py_ssize_t* rp, Py_ssize_t re,
                  const uint8_t* lits, Py_ssize_t* lp, Py_ssize_t le,
                  const uint8_t* floats, Py_ssize_t* fp, Py_ssize_t fe,
                  const uint8_t* toks, Py_ssize_t* tp, Py_ssize_t te,
                  Buf* seen, uint8_t* prev_float, const Granules* g,
                  const uint8_t* grefs, Py_ssize_t* gp, Py_ssize_t ge) noexcept nogil:
    # -1: the columns do not hold the payload; -2: memory ran out.
    # The skeleton's bytes that come back as they are go out a run at a time, from `run`.
    cdef Py_ssize_t n, items, k, run = pos
    cdef uint64_t back, v
    cdef uint8_t b
    cdef int w
    while pos < end:
        b = s[pos]
        n = kvscope_column_span[b]
        if n != 0:  # nearly every token: out with the run it is part of
            if n > end - pos:
                return -1
            pos += n
            continue
        if b == 0xCF or b == 0xD3 or b == 0xCB:
            if put_nogil(out, s + run, pos - run) < 0 or grow_nogil(out, 9) < 0:
                return -2
            out.p[out.n] = b
            pos += 1
            run = pos
            if b == 0xCB:
                if fe - fp[0] < 8:
                    return -1
                for k in range(8):
                    prev_float[k] ^= floats[fp[0] + k]
                fp[0] += 8
                memcpy(out.p + out.n + 1, prev_float, 8)
            else:
                if get_varint(refs, rp, re, &back) < 0:
                    return -1
                if back == 0:
                    if le - lp[0] < 8:
                        return -1
                    memcpy(&v, lits + lp[0], 8)
                    lp[0] += 8
                elif back <= <uint64_t>(seen.n // 8):
                    memcpy(&v, seen.p + seen.n - 8 * <Py_ssize_t>back, 8)
                else:
                    return -1
                if put_nogil(seen, <uint8_t*>&v, 8) < 0:
                    return -2
                memcpy(out.p + out.n + 1, &v, 8)
            out.n += 9
            continue
        n = token(s, pos, end, &items)
        if n < 0:
            return -1
        pos += n
        if items > 0 and pos < end and s[pos] == MARK:
            if put_nogil(out, s + run, pos - run) < 0:
                return -2
            pos += 1
            run = pos
            if g != NULL:
                n = granules_join(g, items, toks, tp, te, grefs, gp, ge, out)
                if n < 0:
                    return n
                continue
            n = ids_bytes(toks + tp[0], te - tp[0], items)
            if n <= 0:
                return -1
            if put_nogil(out, toks + tp[0], n) < 0:
                return -2
            tp[0] += n
    return -2 if put_nogil(out, s + run, pos - run) < 0 else 0


cdef inline int join_all(Py_ssize_t count, const uint8_t** cols, const Py_ssize_t* lens,
                  const Granules* g, Buf* out, Py_ssize_t* starts) noexcept nogil:
    """`join`'s walk over the columns `cols` (of `lens` bytes: sizes, skeleton, references,
    literals, floats, tokens, granules' numbers) into `out`, payload k at `starts[k]` to
    `starts[k + 1]`: 0, -1 if the sizes are cut short, -2 if memory ran out, -3 if a payload
    does not come back whole, -4 if bytes are left over."""
    cdef Buf seen
    cdef Py_ssize_t sp = 0, zp = 0, rp = 0, lp = 0, fp = 0, tp = 0, gp = 0, k, n
    cdef uint64_t size
    cdef uint8_t prev_float[8]
    cdef int r = 0
    memset(&seen, 0, sizeof(Buf))
    memset(prev_float, 0, 8)
    for k in range(count):
        if get_varint(cols[0], &zp, lens[0], &size) < 0 or (size >> 1) > <uint64_t>(
            lens[1] - sp
        ):
            r = -1
            break
        n = <Py_ssize_t>(size >> 1)
        starts[k] = out.n
        if size & 1:
            if put_nogil(out, cols[1] + sp, n) < 0:
                r = -2
                break
        else:
            r = join_one(cols[1], sp, sp + n, out, cols[2], &rp, lens[2], cols[3], &lp, lens[3],
                         cols[4], &fp, lens[4], cols[5], &tp, lens[5], &seen, prev_float, g,
                         cols[6], &gp, lens[6])
            if r < 0:
                r = -3 if r == -1 else r
                break
        sp += n
    free(seen.p)
    if r == 0 and (sp != lens[1] or zp != lens[0] or rp != lens[2] or lp != lens[3]
                   or fp != lens[4] or tp != lens[5] or gp != lens[6]):
        r = -4
    starts[count] = out.n
    return r


cdef inline int same_one(const uint8_t* s, Py_ssize_t pos, Py_ssize_t end, const uint8_t* p,
                         Py_ssize_t plen, const uint8_t* refs, Py_ssize_t* rp, Py_ssize_t re,
                         const uint8_t* lits, Py_ssize_t* lp, Py_ssize_t le,
                         const uint8_t* floats, Py_ssize_t* fp, Py_ssize_t fe,
                         const uint8_t* toks, Py_ssize_t* tp, Py_ssize_t te,
                         uint64_t* seen, Py_ssize_t* sn, uint8_t* prev_float,
                         const Granules* g, const uint8_t* grefs, Py_ssize_t* gp, Py_ssize_t ge,
                         Buf* scratch) noexcept nogil:
    """`join_one`'s walk, each piece it would put compared with the payload `p` (of `plen`
    bytes) where it would go instead: 1 if it gives `p` back whole, 0 if not, -2 if memory ran
    out. The same reads of the columns, in the same order, as `join_one`'s."""
    cdef Py_ssize_t n, items, k, run = pos, q = 0
    cdef uint64_t back, v
    cdef uint8_t b
    while pos < end:
        b = s[pos]
        n = kvscope_column_span[b]
        if n != 0:  # nearly every token: compared with the run it is part of
            if n > end - pos:
                return 0
            pos += n
            continue
        if b == 0xCF or b == 0xD3 or b == 0xCB:
            n = pos - run
            if plen - q < n + 9 or memcmp(p + q, s + run, n) != 0 or p[q + n] != b:
                return 0
            q += n + 1
            pos += 1
            run = pos
            if b == 0xCB:
                if fe - fp[0] < 8:
                    return 0
                for k in range(8):
                    prev_float[k] ^= floats[fp[0] + k]
                fp[0] += 8
                if memcmp(p + q, prev_float, 8) != 0:
                    return 0
            else:
                if get_varint(refs, rp, re, &back) < 0:
                    return 0
                if back == 0:
                    if le - lp[0] < 8:
                        return 0
                    memcpy(&v, lits + lp[0], 8)
                    lp[0] += 8
                elif back <= <uint64_t>sn[0]:
                    v = seen[sn[0] - <Py_ssize_t>back]
                else:
                    return 0
                seen[sn[0]] = v
                sn[0] += 1
                if memcmp(p + q, &v, 8) != 0:
                    return 0
            q += 8
            continue
        n = token(s, pos, end, &items)
        if n < 0:
            return 0
        pos += n
        if items > 0 and pos < end and s[pos] == MARK:
            n = pos - run
            if plen - q < n or memcmp(p + q, s + run, n) != 0:
                return 0
            q += n
            pos += 1
            run = pos
            if g != NULL and g.n != 0:
                scratch.n = 0
                n = granules_join(g, items, toks, tp, te, grefs, gp, ge, scratch)
                if n < 0:
                    return 0 if n == -1 else -2
                if plen - q < scratch.n or memcmp(p + q, scratch.p, scratch.n) != 0:
                    return 0
                q += scratch.n
                continue
            if g != NULL:  # an empty index: each granule's number 0 (`granules_join`'s)
                for k in range(items // GRANULE_IDS):
                    if get_varint(grefs, gp, ge, &back) < 0 or back != 0:
                        return 0
            n = ids_bytes(toks + tp[0], te - tp[0], items)
            if n <= 0 or plen - q < n or memcmp(p + q, toks + tp[0], n) != 0:
                return 0
            tp[0] += n
            q += n
    n = pos - run
    return plen - q == n and memcmp(p + q, s + run, n) == 0


cdef inline int same_all(Py_ssize_t count, const uint8_t** cols, const Py_ssize_t* lens,
                         const Granules* g, const uint8_t** ptrs,
                         const Py_ssize_t* plens) noexcept nogil:
    """Whether `join_all` gives the `count` payloads `ptrs` (of `plens` bytes) back exactly,
    walked as it walks but compared in place of being put: 1, 0 if not, -1 if memory ran
    out."""
    cdef Buf scratch
    cdef Py_ssize_t sp = 0, zp = 0, rp = 0, lp = 0, fp = 0, tp = 0, gp = 0, sn = 0, k, n
    cdef uint64_t size
    cdef uint8_t prev_float[8]
    # A hash takes a byte of the references at least: never more of them than its bytes.
    cdef uint64_t* seen = <uint64_t*>malloc((lens[2] + 1) * sizeof(uint64_t))
    cdef int r = 1
    if seen == NULL:
        return -1
    memset(&scratch, 0, sizeof(Buf))
    memset(prev_float, 0, 8)
    for k in range(count):
        if get_varint(cols[0], &zp, lens[0], &size) < 0 or (size >> 1) > <uint64_t>(
            lens[1] - sp
        ):
            r = 0
            break
        n = <Py_ssize_t>(size >> 1)
        if size & 1:
            if n != plens[k] or memcmp(cols[1] + sp, ptrs[k], n) != 0:
                r = 0
                break
        else:
            r = same_one(cols[1], sp, sp + n, ptrs[k], plens[k], cols[2], &rp, lens[2],
                         cols[3], &lp, lens[3], cols[4], &fp, lens[4], cols[5], &tp, lens[5],
                         seen, &sn, prev_float, g, cols[6], &gp, lens[6], &scratch)
            if r != 1:
                break
        sp += n
    free(seen)
    free(scratch.p)
    if r == -2:
        return -1
    if r == 1 and (sp != lens[1] or zp != lens[0] or rp != lens[2] or lp != lens[3]
                   or fp != lens[4] or tp != lens[5] or gp != lens[6]):
        r = 0
    return r
