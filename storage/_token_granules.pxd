# A stream's token runs (storage/_token_granules.pyx), and the noting of a transaction's batches
# in them as a job: opened holding the GIL, run without it (the log's packing runs it in the
# same let-go as its own walks, which may read its payloads for it: storage/_log_columns.pyx),
# closed holding it again.
from libc.stdint cimport uint64_t

from kvscope.collector._msgpack cimport Reader
from kvscope.storage._log_fold cimport Folded
from kvscope.storage._run_table cimport Table


cdef class RunTable:
    cdef Table t
    cdef readonly Py_ssize_t granule
    cdef bint busy
    cdef readonly tuple noted  # the last job's counts, as `note` gives them

    cdef _sorted(self)


cdef struct NoteJob:
    Table* t
    Reader* readers
    Py_ssize_t n
    Py_ssize_t granule
    uint64_t when
    Py_ssize_t counts[2]
    int done
    Folded fold  # the payloads the log's split read for it (storage/_log_fold.pxd)
    Py_ssize_t folded  # payloads noted from the split's granules
    Py_ssize_t walked  # payloads the note walked itself


cdef int note_open(NoteJob* job, RunTable table, list payloads, Py_ssize_t step,
                   uint64_t when) except -1
cdef void note_run(NoteJob* job) noexcept nogil
cdef tuple note_close(NoteJob* job, RunTable table)
