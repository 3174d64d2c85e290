"""`LiveSink` (collector/_live_sink.pyx), declared for the live path (collector/_ingest_live.pyx),
which tells such a sink of each batch in C, and for the sinks built on it (storage/)."""


cdef class LiveSink:
    cdef int batch_applied(self, object stream, object epoch, object seq, object ts,
                           object recv_ts, object payload, object decoded, object changes,
                           object gaps, object view) except -1
