# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# The batch log's format 3 columns (storage/log_columns.py): a chunk's payloads split, byte for
# byte, into a skeleton and columns that compress apart. The split is a walk over msgpack's
# tokens in the order they lie (no nesting is tracked, so any layout is read the same way):
# 8-byte ints (hashes) go to a column of references to their earlier occurrence in the chunk
# or literals, 8-byte floats to a column of XORs with the float before, and an array's items,
# when all are ints of at most 4 bytes (token ids), to a token column kept as their msgpack
# bytes (what the stream's dictionary holds), the skeleton marking them with 0xC1 (a byte
# msgpack never uses). A payload the walk cannot read whole is kept verbatim. The join walks
# the skeleton the same way, so every byte comes back from where it went.
# A chunk's packing is storage/_log_run.pxd's; here are the calls from Python, and what the
# packings share: the rooms learned from the last, and the counts the tests read.
from libc.stdint cimport uint8_t
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memset
from cpython.bytes cimport PyBytes_FromStringAndSize

from kvscope.storage._log_buf cimport Buf, taken
from kvscope.storage._log_rooms cimport COLUMNS, room_sizes
from kvscope.storage._log_join cimport gathered, same_back
from kvscope.storage._log_walk cimport join_all
from kvscope.storage._granules cimport GRANULE_IDS, GranuleIndex, Granules
from kvscope.storage._token_granules cimport NoteJob, RunTable, note_close, note_open, note_run
from kvscope.storage._log_run cimport (
    Run, run_close, run_open, run_outgrown, run_pack, run_scratch, run_split
)


cdef Py_ssize_t _walks_let_go = 0
"""How many times the split and the packing let go of the GIL: `walks_let_go`."""


cdef Py_ssize_t _notes_read[2]
_notes_read[:] = [0, 0]
"""Payloads the content's note read from the split's walk, and payloads it walked itself:
`notes_read`."""


cdef Py_ssize_t _checks[2]
_checks[:] = [0, 0]
"""Chunks `pack_runs` joined back and compared, and chunks it packed unchecked (read by the
split's plain paths alone): `checks_made`."""


cdef Py_ssize_t _scratch_most = 0
"""The most chunks' hash tables the last `pack_runs` held at once: `scratch_most`."""


cdef Py_ssize_t _shares[7]
_shares[:] = [1024, 640, 24, 80, 24, 512, 24]
"""Each column's room, in 1024ths of its chunk's payload bytes (storage/_log_rooms.pxd): the
most each took in the chunks `pack_runs` packed last, and a sixteenth (at first, a little over
what block events take). Written under the GIL by `pack_runs`; a walk on another thread may
read it without: a torn read costs only a room's fit, never a write past it."""


cdef Py_ssize_t _outgrown = 0
"""How many columns outgrew their rooms (storage/_log_rooms.pxd): `rooms_outgrown`."""


def rooms_outgrown():
    """How many columns `split` and `pack_runs` have grown past the room made for them (a
    test's count)."""
    return _outgrown


def room_sizes_of(list payloads, bint granules=False):
    """The most `split` can put in each column of `payloads` (with an index of `granules`, one
    more: the granules' numbers, for an index of 2**32 - 1 of them at most)."""
    cdef Py_ssize_t sizes[COLUMNS]
    room_sizes(len(payloads), sum(map(len, payloads)), (1 << 32) - 1 if granules else -1, sizes)
    return [sizes[i] for i in range(COLUMNS if granules else COLUMNS - 1)]


def room_shares():
    """Each column's room now, in 1024ths of a chunk's payload bytes."""
    return [_shares[i] for i in range(COLUMNS)]


def set_room_shares(list shares):
    """Each column's room for the next `pack_runs` (a test's: rooms too small or too large
    must not change a byte); learned again from what it packs."""
    cdef Py_ssize_t i
    for i in range(COLUMNS):
        _shares[i] = min(max(0, <Py_ssize_t>shares[i]), 1 << 20)


def scratch_most():
    """How many chunks' hash tables (their scratch, the most memory a chunk's packing takes
    beside its columns) the last `pack_runs` held at once (a test's count: one at a time)."""
    return _scratch_most


def checks_made():
    """(chunks `pack_runs` joined back and compared with their payloads, chunks it packed
    unchecked): a test's counts."""
    return _checks[0], _checks[1]


def notes_read():
    """(payloads `pack_runs`' notes read from the split's walk, payloads they walked apart):
    a test's counts."""
    return _notes_read[0], _notes_read[1]


cdef int fold_set(Run* r, NoteJob* job, list noted, Py_ssize_t first, Py_ssize_t step,
                  tuple held) except -1:
    """`r`'s split set to note its payloads for `job` (`noted` its payloads, every `step`th
    noted), the run's payload k being its payload `first` + k, as `held` shows."""
    cdef Py_ssize_t k, count = len(held)
    if first < 0 or first + count > PyList_GET_SIZE(noted):
        raise ValueError("a run's payloads lie outside its note's")
    for k in range(count):
        if PyList_GET_ITEM(noted, first + k) is not PyTuple_GET_ITEM(held, k):
            raise ValueError("a run's payloads are not its note's")
    if job.granule != GRANULE_IDS:
        return 0  # the split keeps granules of its own size: the note walks its payloads
    r.fold.job = &job.fold
    r.fold.first = first
    r.fold.step = step
    return 0


def walks_let_go():
    """How many times `split`, `joins_back` and `pack_runs` have let go of the GIL (a test's
    count: the writer packs a transaction's chunks letting it go once)."""
    return _walks_let_go


cdef tuple run_parts(Run* r):
    """The run's columns as `split` gives them (with format 5's planes, where made, in place
    of the tokens, their upper planes last), and the count kept verbatim."""
    global _outgrown
    cdef list parts = [taken(&r.cols[i]) for i in range(6 if r.g == NULL else 7)]
    _outgrown += r.outgrown
    if r.plane_ids >= 0:
        parts.append(taken(&r.rest))
    return parts, r.kept


cdef void shares_learned(const Run* work, Py_ssize_t n) noexcept:
    """`_shares` from the runs just packed: the most each column took, and a sixteenth."""
    cdef Py_ssize_t learned[7]
    cdef Py_ssize_t i, k, need
    cdef bint seen = False
    memset(learned, 0, sizeof(learned))
    for k in range(n):
        if work[k].total == 0:
            continue
        seen = True
        for i in range(7):
            need = (work[k].wrote[i] << 10) // work[k].total + 1
            learned[i] = max(learned[i], need + need // 16)
    if seen:
        for i in range(7):
            _shares[i] = learned[i]


def split(list payloads, bint verbatim=False, GranuleIndex granules=None):
    """`payloads` as (sizes, skeleton, references, literals, floats, tokens), and the
    granules' numbers with `granules` (format 4), and the count kept verbatim; all verbatim if
    `verbatim`. The walk runs without the GIL (`payloads` holds the bytes meanwhile)."""
    cdef Run r
    cdef int failed
    cdef tuple held = tuple(payloads)  # the bytes stay alive whatever becomes of the list
    memset(&r, 0, sizeof(Run))
    try:
        run_open(&r, held, granules)
        global _walks_let_go
        _walks_let_go += 1
        with nogil:
            failed = run_scratch(&r)
            if failed == 0:
                failed = run_split(&r, verbatim, _shares)
                run_outgrown(&r)
        if failed:
            raise MemoryError()
        parts, kept = run_parts(&r)
        return tuple(parts), kept
    finally:
        run_close(&r)


def fields(list rows, Py_ssize_t width):
    """The fields of `rows` (plain tuples of at least `width` items: the writer's log rows) as
    `width` lists, or None where a row is no such tuple (the caller then reads them its own
    way): `itemgetter` over each row costs a call per field and row, with the GIL held."""
    cdef Py_ssize_t n = len(rows), i, k
    cdef list cols = [[None] * n for k in range(width)]
    cdef object row
    for i in range(n):
        row = rows[i]
        if type(row) is not tuple or len(<tuple>row) < width:
            return None
        for k in range(width):
            (<list>cols[k])[i] = (<tuple>row)[k]
    return cols


def pack_runs(list runs, list indexes, list planes, list notes=None, list folds=None):
    """Each run's payloads (a list of bytes) as `split`'s columns, checked as `joins_back`
    checks them where a payload took a path other than the split's plain ones (all verbatim
    where they do not join back: storage/_log_run.pxd), with format 5's token planes where
    `planes` says and the ids fit; as (columns, count kept verbatim) per run. The work of a
    transaction's chunks lets go of the GIL once: taking it back from a busy ingest thread can
    cost a switch interval (and under load, the holder's wait for a CPU). `notes`: (RunTable,
    payloads, step, when) each, noted as `RunTable.note` notes them once the runs are packed, in
    the same let-go (each table's `noted` then holds its counts). `folds`: per run, None or
    (the note whose payloads hold its own, where the run's first lies among them): the run's
    split reads the payloads that note notes for it, and the note walks only those the split
    could not read as it would (storage/_log_fold.pxd)."""
    cdef Py_ssize_t n = len(runs), i, m = 0 if notes is None else len(notes)
    if len(indexes) != n or len(planes) != n:  # read below without bounds checks
        raise ValueError(f"{n} runs, {len(indexes)} indexes, {len(planes)} plane flags")
    if folds is not None and len(folds) != n:
        raise ValueError(f"{n} runs, {len(folds)} folds")
    cdef Run* work = <Run*>calloc(n + 1, sizeof(Run))
    cdef NoteJob* jobs = <NoteJob*>calloc(m + 1, sizeof(NoteJob))
    cdef list held = [tuple(run) for run in runs]  # their bytes stay alive meanwhile
    cdef list noting = [] if notes is None else [tuple(note) for note in notes]
    cdef int failed = 0
    cdef Py_ssize_t tables = 0, most = 0
    cdef bint had
    if work == NULL or jobs == NULL:
        free(work)
        free(jobs)
        raise MemoryError()
    try:
        for i in range(n):
            run_open(&work[i], held[i], indexes[i])
            work[i].planes = planes[i] and indexes[i] is not None
            tables += work[i].h.values != NULL
        for i in range(m):
            table, payloads, step, when = noting[i]
            note_open(&jobs[i], table, payloads, step, when)
        for i in range(0 if folds is None else n):
            if folds[i] is not None:
                job, first = folds[i]
                if not 0 <= job < m:
                    raise ValueError(f"run {i} names note {job} of {m}")
                fold_set(&work[i], &jobs[job], noting[job][1], first, noting[job][2], held[i])
        most = tables
        global _walks_let_go, _scratch_most
        _walks_let_go += 1
        with nogil:
            for i in range(n):
                # A run without its table makes one for its walk: one more held meanwhile.
                had = work[i].h.values != NULL
                most = max(most, tables + (not had))
                if run_pack(&work[i], _shares) < 0:
                    failed = 1
                    break
                tables += (work[i].h.values != NULL) - had
            if not failed:  # as before: the content is noted once the chunks are packed
                for i in range(m):
                    note_run(&jobs[i])
        _scratch_most = most
        if failed:
            raise MemoryError()
        shares_learned(work, n)
        for i in range(n):
            _checks[0 if work[i].checked else 1] += 1
        parts = [run_parts(&work[i]) for i in range(n)]
    finally:
        for i in range(n):
            run_close(&work[i])
        free(work)
        for i in range(m):  # every table let go, whichever ran out of memory
            _notes_read[0] += jobs[i].folded
            _notes_read[1] += jobs[i].walked
            if jobs[i].readers != NULL:
                try:
                    note_close(&jobs[i], <RunTable>noting[i][0])
                except MemoryError:
                    failed = 2
        free(jobs)
    if failed == 2:
        raise MemoryError()
    return parts



def join(Py_ssize_t count, bytes sizes, bytes skel, bytes refs, bytes lits, bytes floats,
         bytes toks, bytes grefs=b"", GranuleIndex granules=None):
    """The `count` payloads `split` made these columns of (with `granules`: the index it was
    given); ValueError if they do not hold them all, exactly. The walk runs without the GIL
    (the writer checks each chunk it packs this way, while the ingest thread wants the GIL)."""
    cdef Buf out
    cdef const Granules* g = NULL if granules is None else &granules.g
    cdef const uint8_t* cols[7]
    cdef Py_ssize_t lens[7]
    cdef tuple held = (sizes, skel, refs, lits, floats, toks, grefs)
    # Each payload takes a byte of the sizes at least: a count past them is cut short within
    # len(sizes) + 1 payloads, and `starts` is never sized by a hostile count (nor overflows).
    cdef Py_ssize_t k, n = min(max(count, 0), len(sizes) + 1)
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
    cdef int failed
    memset(&out, 0, sizeof(Buf))
    try:
        if starts == NULL:
            raise MemoryError()
        gathered(held, cols, lens, &out)
        with nogil:
            failed = join_all(n, cols, lens, g, &out, starts)
        if failed == -2:
            raise MemoryError()
        if failed:
            raise ValueError({-1: "log columns: sizes cut short",
                              -3: "log columns: a payload does not come back whole",
                              -4: "log columns: bytes left over"}[failed])
        return [PyBytes_FromStringAndSize(<char*>out.p + starts[k], starts[k + 1] - starts[k])
                for k in range(n)]
    finally:
        free(out.p)
        free(starts)


def joins_back(list payloads, bytes sizes, bytes skel, bytes refs, bytes lits, bytes floats,
               bytes toks, bytes grefs=b"", GranuleIndex granules=None):
    """Whether `join` gives `payloads` back from these columns, exactly: the check of a chunk
    packed, its walk and comparison without the GIL, and no bytes object made per payload."""
    cdef Buf out
    cdef const Granules* g = NULL if granules is None else &granules.g
    cdef const uint8_t* cols[7]
    cdef Py_ssize_t lens[7]
    cdef tuple held = (sizes, skel, refs, lits, floats, toks, grefs)
    cdef Py_ssize_t k, count = len(payloads)
    cdef const uint8_t** ptrs = <const uint8_t**>malloc((count + 1) * sizeof(uint8_t*))
    cdef Py_ssize_t* plens = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    cdef int same
    cdef bytes col
    memset(&out, 0, sizeof(Buf))
    try:
        if ptrs == NULL or plens == NULL:
            raise MemoryError()
        if count > len(sizes) + 1:  # each payload takes a byte of the sizes at least
            return False
        gathered(held, cols, lens, &out)
        for k in range(count):
            col = payloads[k]  # the list holds each: their buffers stay put
            ptrs[k] = <const uint8_t*>col
            plens[k] = len(col)
        global _walks_let_go
        _walks_let_go += 1
        with nogil:
            same = same_back(count, cols, lens, g, ptrs, plens)
        if same < 0:
            raise MemoryError()
        return same == 1
    finally:
        free(out.p)
        free(ptrs)
        free(plens)
