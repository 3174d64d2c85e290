# cython: boundscheck=False, wraparound=False, cdivision=True
# The token ids a batch carries, cut into runs of `granule` ids as they lie in its msgpack bytes,
# and noted in a stream's content (storage/log_dictionary.py): every array of at least `granule`
# ints that fit 32 bits (token ids; hashes are 64-bit) is cut, each other value walked into or
# stepped over, so vLLM's map and array layouts alike are read. What it cannot read is left
# out: the content only makes the log smaller, never different. The runs are kept in C, in a
# table of their own (storage/_run_table.pxd), and a transaction's batches are noted with the
# GIL let go: the writer thread's noting then runs beside the ingest thread, not in turn.
import os

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from kvscope.collector._msgpack cimport MAX_DEPTH, Reader, read_array, read_map, skip
from kvscope.storage._log_fold cimport Gran
from kvscope.storage._msgpack_widths cimport kvscope_scalar_width, kvscope_token_width
from kvscope.storage._run_table cimport (
    Table, table_clear, table_init, table_keep_sorted, table_note, table_sort
)

cdef enum:
    NO_MEMORY = -3
    CUTS = 64  # granules of an array noted in one walk of its ids (a longer one takes two)


cdef bint all_tokens(Reader* r, Py_ssize_t n) noexcept nogil:
    """Whether the array's `n` items are ints that fit 32 bits, not negative (the reader is
    moved on). Read by their bytes, not their values: `note_runs` walks them again."""
    cdef const uint8_t* p = r.p
    cdef Py_ssize_t k, pos = r.pos
    cdef int w
    cdef uint8_t b
    for k in range(n):
        if pos >= r.end:
            return False
        b = p[pos]
        w = kvscope_token_width[b]
        if w == 0 or r.end - pos < w:
            return False
        if w == 9:  # uint64, int64: the upper half is zero (which clears the sign too)
            if p[pos + 1] | p[pos + 2] | p[pos + 3] | p[pos + 4]:
                return False
        elif b >= 0xD0 and p[pos + 1] & 0x80:  # int8..int32 below zero
            return False
        pos += w
    r.pos = pos
    return True


cdef int note_runs(Reader* r, Py_ssize_t n, Py_ssize_t granule, Table* seen, uint64_t when,
                   Py_ssize_t* counts) noexcept nogil:
    """The array's runs of `granule` ids noted (its `n` items read by `all_tokens` already)."""
    cdef const uint8_t* p = r.p
    cdef Py_ssize_t k, pos = r.pos, cut = r.pos, left = granule
    cdef int held
    for k in range(n):
        pos += kvscope_token_width[p[pos]]
        left -= 1
        if left == 0:
            held = table_note(seen, p + cut, pos - cut, when)
            if held < 0:
                return NO_MEMORY
            counts[held] += pos - cut
            cut = pos
            left = granule
    r.pos = pos
    return 0


cdef inline int token_width(const uint8_t* p, Py_ssize_t pos) noexcept nogil:
    """Bytes of the token id at `pos` (`all_tokens`' test), else 0; the caller knows there is
    room for its bytes (or for the widest id's)."""
    cdef uint8_t b = p[pos]
    cdef int w = kvscope_token_width[b]
    if w == 0:
        return 0
    if w == 9:  # uint64, int64: the upper half is zero (which clears the sign too)
        if p[pos + 1] | p[pos + 2] | p[pos + 3] | p[pos + 4]:
            return 0
    elif b >= 0xD0 and p[pos + 1] & 0x80:  # int8..int32 below zero
        return 0
    return w


cdef bint tokens_cut(Reader* r, Py_ssize_t n, Py_ssize_t granule, Py_ssize_t* cuts) noexcept nogil:
    """`all_tokens`, keeping where each whole granule ends (from the array's first id) in
    `cuts` (room for `n // granule + 1`: the ids after the last whole granule end there too)."""
    cdef const uint8_t* p = r.p
    cdef Py_ssize_t k, pos = r.pos, start = r.pos, j, ids
    cdef int w
    for j in range(n // granule + 1):
        ids = granule if j < n // granule else n % granule
        if r.end - pos >= 9 * ids:  # room for the widest ids: no bound to test per id
            for k in range(ids):
                w = token_width(p, pos)
                if w == 0:
                    return False
                pos += w
        else:
            for k in range(ids):
                if pos >= r.end or r.end - pos < kvscope_token_width[p[pos]]:
                    return False
                w = token_width(p, pos)  # its bytes there: read only now
                if w == 0:
                    return False
                pos += w
        cuts[j] = pos - start
    r.pos = pos
    return True


cdef int note_cut(const uint8_t* p, Py_ssize_t granules, const Py_ssize_t* cuts, Table* seen,
                  uint64_t when, Py_ssize_t* counts) noexcept nogil:
    """The granules `tokens_cut` found from `p` noted."""
    cdef Py_ssize_t j, cut = 0
    cdef int held
    for j in range(granules):
        held = table_note(seen, p + cut, cuts[j] - cut, when)
        if held < 0:
            return NO_MEMORY
        counts[held] += cuts[j] - cut
        cut = cuts[j]
    return 0


cdef inline int step_scalar(Reader* r) noexcept nogil:
    """Steps over a scalar `kvscope_scalar_width` knows: 1, or 0 if the value is none such
    (the caller walks it), -1 where `skip` would find it cut short."""
    cdef Py_ssize_t w
    if r.pos >= r.end:
        return -1
    w = kvscope_scalar_width[r.p[r.pos]]
    if w == 0:
        return 0
    if r.end - r.pos < w:
        return -1
    r.pos += w
    return 1


cdef int walk(Reader* r, int depth, Py_ssize_t granule, Table* seen, uint64_t when,
              Py_ssize_t* counts) noexcept nogil:
    """0, or -1 where the payload stops reading (what was noted stays), or NO_MEMORY."""
    cdef Py_ssize_t n, k, start
    cdef Py_ssize_t cuts[CUTS + 1]
    cdef uint8_t b
    cdef int done
    if depth > MAX_DEPTH or r.pos >= r.end:
        return -1
    b = r.p[r.pos]
    if (0x90 <= b <= 0x9F) or b == 0xDC or b == 0xDD:
        if read_array(r, &n) < 0:
            return -1
        start = r.pos
        if n >= granule and n // granule <= CUTS:
            # One walk: the ids read and each granule's end kept, then the granules noted.
            if tokens_cut(r, n, granule, cuts):
                return note_cut(r.p + start, n // granule, cuts, seen, when, counts)
        elif n >= granule and all_tokens(r, n):
            r.pos = start
            return note_runs(r, n, granule, seen, when, counts)
        r.pos = start
        for k in range(n):
            if depth < MAX_DEPTH:  # an item's walk would step over a scalar as this does
                done = step_scalar(r)
                if done:
                    if done < 0:
                        return done
                    continue
            done = walk(r, depth + 1, granule, seen, when, counts)
            if done < 0:
                return done
        return 0
    if (0x80 <= b <= 0x8F) or b == 0xDE or b == 0xDF:
        if read_map(r, &n) < 0:
            return -1
        for k in range(2 * n):
            if depth < MAX_DEPTH:
                done = step_scalar(r)
                if done:
                    if done < 0:
                        return done
                    continue
            done = walk(r, depth + 1, granule, seen, when, counts)
            if done < 0:
                return done
        return 0
    return skip(r, depth)


cdef int note_open(NoteJob* job, RunTable table, list payloads, Py_ssize_t step,
                   uint64_t when) except -1:
    """`job` (zeroed) set to note every `step`th of `payloads` (from the first) in `table`,
    which is busy until `note_close`; the caller holds `payloads` meanwhile."""
    if step < 1:
        raise ValueError("step must be at least 1")
    if table.busy:
        raise RuntimeError("a RunTable is one thread's")
    cdef Py_ssize_t n = (len(payloads) + step - 1) // step, i, k = 0
    cdef Reader* readers = <Reader*>malloc(max(n, 1) * sizeof(Reader))
    cdef Py_ssize_t* at = <Py_ssize_t*>malloc(max(n, 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t* upto = <Py_ssize_t*>malloc(max(n, 1) * sizeof(Py_ssize_t))
    if readers == NULL or at == NULL or upto == NULL:
        free(readers)
        free(at)
        free(upto)
        raise MemoryError()
    for i in range(n):
        upto[i] = -1  # walked, unless the log's split reads it
    for i in range(0, len(payloads), step):
        payload = payloads[i]
        if type(payload) is not bytes:
            free(readers)
            free(at)
            free(upto)
            raise TypeError("payloads are bytes")
        # The list holds each payload, and bytes do not change: their buffers stay put.
        readers[k].p = <const uint8_t*>PyBytes_AS_STRING(payload)
        readers[k].pos = 0
        readers[k].end = PyBytes_GET_SIZE(payload)
        k += 1
    job.t = &table.t
    job.readers = readers
    job.n = n
    job.granule = table.granule
    job.when = when
    job.counts[0] = job.counts[1] = 0
    job.done = 0
    memset(&job.fold.grans, 0, sizeof(job.fold.grans))
    job.fold.at = at
    job.fold.upto = upto
    job.folded = job.walked = 0
    table.busy = True
    return 0


cdef int note_read(NoteJob* job, Py_ssize_t i) noexcept nogil:
    """The granules the log's split kept of the job's payload `i` noted."""
    cdef const Gran* grans = <const Gran*>(job.fold.grans.p + job.fold.at[i])
    cdef Py_ssize_t j, count = (job.fold.upto[i] - job.fold.at[i]) // <Py_ssize_t>sizeof(Gran)
    cdef int held
    for j in range(count):
        held = table_note(job.t, grans[j].p, grans[j].n, job.when)
        if held < 0:
            return NO_MEMORY
        job.counts[held] += grans[j].n
    return 0


cdef void note_run(NoteJob* job) noexcept nogil:
    """The job's walks (a job run once; one not opened does nothing): of each payload the log's
    split read for it, its granules noted; of each other, the payload walked."""
    cdef Py_ssize_t i
    cdef int done
    for i in range(job.n):
        if job.fold.upto[i] >= 0:
            done = note_read(job, i)
            job.folded += 1
        else:
            done = walk(&job.readers[i], 0, job.granule, job.t, job.when, job.counts)
            job.walked += 1
        if done == NO_MEMORY:
            job.done = NO_MEMORY
            break
    job.n = 0


cdef tuple note_close(NoteJob* job, RunTable table):
    """The job's (bytes of runs new to the table, bytes of runs it held); its table free
    again. Raises MemoryError where the walks ran out."""
    if job.readers == NULL:
        return None
    free(job.readers)
    free(job.fold.at)
    free(job.fold.upto)
    free(job.fold.grans.p)
    job.readers = NULL
    job.fold.at = job.fold.upto = NULL
    job.fold.grans.p = NULL
    table.busy = False
    if job.done == NO_MEMORY:
        raise MemoryError()
    table.noted = (job.counts[0], job.counts[1])
    return table.noted


cdef class RunTable:
    """A stream's distinct runs of `granule` token ids (their msgpack bytes), each with when it
    was last seen (a count the caller keeps), the least recently seen first; of those seen
    together, the first seen first (as a dict's insertion order kept them). One thread's."""

    def __cinit__(self, Py_ssize_t granule, Py_ssize_t cap=0):
        if granule < 1:
            raise ValueError("granule must be at least 1")
        self.granule = granule
        if table_init(&self.t, int.from_bytes(os.urandom(8), "little"), max(cap, 0)) < 0:
            raise MemoryError()

    def __dealloc__(self):
        table_clear(&self.t)

    def __len__(self):
        return self.t.count

    @property
    def reserved(self):
        """Bytes its buffer of runs takes (what they use, and room to grow)."""
        return self.t.room

    @property
    def index_slots(self):
        return self.t.mask + 1

    def fail_allocations_after(self, Py_ssize_t n):
        """For tests: the allocation after the next `n` fails, as out of memory (-1: none)."""
        self.t.fail_after = n

    def note(self, list payloads, Py_ssize_t step, uint64_t when):
        """Note the runs of every `step`th of `payloads` (from the first) as seen `when`, the
        GIL let go meanwhile: (bytes of runs new to the table, bytes of runs it held)."""
        cdef NoteJob job
        memset(&job, 0, sizeof(NoteJob))
        note_open(&job, self, payloads, step, when)
        try:
            with nogil:
                note_run(&job)
        finally:
            done = note_close(&job, self)
        return done

    def evict(self, Py_ssize_t held, double down_to):
        """Drop the least recently seen runs, one at least, until `held` (the bytes held, less
        those dropped) is `down_to` or under: what is held then."""
        if self.busy:
            raise RuntimeError("a RunTable is one thread's")
        cdef Py_ssize_t drop = 0
        cdef int done
        self.busy = True
        with nogil:
            table_sort(&self.t)
            while drop < self.t.count:
                held -= self.t.entries[drop].length
                drop += 1
                if held <= down_to:
                    break
            done = table_keep_sorted(&self.t, drop)
        self.busy = False
        if done < 0:
            raise MemoryError()
        return held

    def runs(self):
        """The runs held, least recently seen first."""
        self._sorted()
        cdef const char* base = <const char*>self.t.bytes
        return [
            PyBytes_FromStringAndSize(base + self.t.entries[i].offset, self.t.entries[i].length)
            for i in range(self.t.count)
        ]

    def content(self):
        """The runs held, least recently seen first, joined."""
        self._sorted()
        return PyBytes_FromStringAndSize(<const char*>self.t.bytes, self.t.used)

    def seen(self):
        """{run: when last seen}, least recently seen first."""
        runs = self.runs()
        return {run: self.t.entries[i].when for i, run in enumerate(runs)}

    cdef _sorted(self):
        if self.busy:
            raise RuntimeError("a RunTable is one thread's")
        table_sort(&self.t)
        if table_keep_sorted(&self.t, 0) < 0:
            raise MemoryError()
