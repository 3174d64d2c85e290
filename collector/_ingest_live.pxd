"""`LiveIngest` (collector/_ingest_live.pyx), declared for the fleet's drain
(collector/_fleet_drain.pyx), which hands it each message in C."""


from kvscope.collector._live_sink cimport BatchChanges


cdef class LiveIngest:
    cdef public object sink, map, counters, epoch, engine
    # What the usual batch is applied from its bytes with (`FusedIngest.fused`), or None.
    cdef public object fused
    cdef public object expected, last_seq, last_message_at, max_message_bytes
    cdef public object _replay, _outbox, _quiet, _degradation, _malformed
    cdef public long long _gaps_told  # the stream's gaps told to its sink so far
    cdef public long long _messages
    cdef object _recent_obj, _recent_append  # `_recent`, and its deque's append
    cdef object _decoder, _max_block_size, _layouts  # `decoder`, its limit and layouts
    cdef object _stream  # `stream`
    cdef long long _stream_rank  # its rank
    cdef BatchChanges _changes  # a `LiveSink`'s batch changes, counted anew for each batch

    cdef live(self, frames, now, decoded)
    cdef apply_known(self, seq, payload, now, decoded)
