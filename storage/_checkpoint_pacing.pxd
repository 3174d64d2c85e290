"""`CheckpointPacer` (storage/_checkpoint_pacing.pyx), declared for the store's sink
(storage/_store_sink.pyx), which counts each batch in C."""


cdef class CheckpointPacer:
    cdef readonly double per_block
    cdef readonly double min_blocks
    cdef readonly long long every_batches
    cdef readonly long long batches_since
    # Block-events (blocks stored and removed) applied since the last checkpoint.
    cdef readonly long long events_since
    # Events at which the next checkpoint is due; 0 while one is forced.
    cdef readonly double due_events

    cpdef bint counted(self, long long events)
