# cython: language_level=3
"""A sink told of each batch applied in C: `LiveSink`.

The live path (collector/_ingest_live.pyx) tells a sink built on it of each batch through
`batch_applied`, a C call with the batch's fields, where any other sink is handed an
`AppliedBatch` through a Python call. A sink that overrides `batch_applied` in C (the store's
writer, storage/_store_sink.pyx) takes the fields it needs and builds no `AppliedBatch` for a
batch it reads nothing else of; the base builds one and calls `applied`, as for any sink.
"""

cimport cython

from kvscope.collector.sink import AppliedBatch

cdef object _APPLIED_BATCH = AppliedBatch


@cython.auto_pickle(False)
cdef class LiveSink:
    """The base of a sink whose `applied` the live path calls in C (collector/sink.py's
    `EventSink` otherwise)."""

    cdef int batch_applied(self, object stream, object epoch, object seq, object ts,
                           object recv_ts, object payload, object decoded, object changes,
                           object gaps, object view) except -1:
        """`applied` of the `AppliedBatch` of these fields."""
        self.applied(
            _APPLIED_BATCH(stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view)
        )
        return 0
