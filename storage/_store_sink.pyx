# cython: language_level=3
"""The store's sink on the ingest thread, in C: `StoreSinkCore`, the base of storage/writer.py's
`StoreWriter`, and `StreamState`, what it keeps per stream.

The live path (collector/_ingest_live.pyx) tells the writer of each batch with a C call of its
fields (`LiveSink.batch_applied`): the stream's state is found, the batch counted into the
second's rollup, its log row put on the queue and the checkpoint pacer told, each a C call, with
no `AppliedBatch` built and no Python frame run. What is rare (a stream's first batch, a new
epoch, a recovery followed, a drop and its end, a checkpoint) is left to the writer's Python
methods, as `applied` left it; those that read the batch get an `AppliedBatch` of it.
`instant`, at each second's end, is here too, with the rollup's part of it in C
(storage/_rollup_counts.pyx's `SecondCore`): while no recovery is followed, no Python frame of
the store's runs.
A subclass that overrides `applied` is told of each batch through it (checked once, of the
class): an `applied` set on an instance, or patched on the class after the writer is made, is
not.
"""

cimport cython
from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject
from libc.stdint cimport uintptr_t

from kvscope.collector._live_sink cimport BatchChanges, LiveSink
from kvscope.storage._checkpoint_pacing cimport CheckpointPacer
from kvscope.storage._queue_core cimport QueueCore
from kvscope.storage._rollup_counts cimport RollupCounts, SecondCore

from kvscope.collector.sink import AppliedBatch
from kvscope.storage.rows import EpochRow

cdef object _APPLIED_BATCH = AppliedBatch
cdef object _EPOCH_ROW = EpochRow
# The Python method, not its C function (which `QueueCore.put_batch` names in Cython).
cdef object _CORE_PUT_BATCH = getattr(QueueCore, "put_batch")
# Places of `StoreSinkCore`'s recent streams (a power of two): a fleet's publishers in turn.
cdef enum:
    _RECENT = 256


cdef object _applied_batch(object stream, object epoch, object seq, object ts, object recv_ts,
                           object payload, object decoded, object changes, object gaps,
                           object view):
    """The `AppliedBatch` of these fields (for a rare path that reads one)."""
    if isinstance(changes, BatchChanges):
        changes = (<BatchChanges>changes).as_dict()
    return _APPLIED_BATCH(stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view)


@cython.auto_pickle(False)
cdef class RecoveriesCore:
    """The base of storage/recovery_follow.py's `StreamRecoveries`: the list the sink tests
    for each batch, a C field."""

    # The recoveries being followed: the sink tests it for each batch.
    cdef public list followed


@cython.final
@cython.auto_pickle(False)
cdef class StreamState:
    """What the writer remembers per stream between batches (ingest thread only)."""

    cdef public object rollup  # its `SecondRollup`
    cdef public RecoveriesCore recoveries  # its `StreamRecoveries`
    cdef public CheckpointPacer pacer
    # `rollup.counts` (never replaced), counted into for each batch.
    cdef readonly RollupCounts counts
    cdef public object epoch
    cdef public object connected_since
    # (epoch, seq, ts) of the first batch dropped since the store last had room.
    cdef public object dropped_from
    cdef public object dropped_to

    def __init__(self, rollup, recoveries, CheckpointPacer pacer not None, epoch=None,
                 connected_since=None, dropped_from=None, dropped_to=None):
        self.rollup = rollup
        self.counts = rollup.counts
        self.recoveries = recoveries
        self.pacer = pacer
        self.epoch = epoch
        self.connected_since = connected_since
        self.dropped_from = dropped_from
        self.dropped_to = dropped_to


@cython.auto_pickle(False)
cdef class StoreSinkCore(LiveSink):
    """The writer's state that each batch reads, `applied` and `instant`, in C. Its subclass
    supplies `_state`, `_put_always`, `_note_drop`, `_close_drop`, `_checkpoint` and
    `_instant_followed`."""

    cdef readonly dict _streams
    cdef QueueCore _queue_core
    # Its class overrides `put_batch` (a test's or a benchmark's): the sink calls that.
    cdef bint _put_overridden
    # The streams of recent batches and their states, by where each stream object's address
    # falls (`_RECENT` places): a stream's batches mostly come in a row, a fleet's in turn, and
    # a StreamId is hashed field by field at each lookup in `_streams`. Each place holds a
    # stream and its state, or None; all are emptied when a state goes.
    cdef list _recent_streams
    cdef list _recent_states
    # A subclass overrides `applied` (a test's tap): the live path's calls go through it too.
    cdef bint _applied_overridden

    def __cinit__(self, *args, **kwargs):
        self._streams = {}
        self._recent_streams = [None] * _RECENT
        self._recent_states = [None] * _RECENT
        self._applied_overridden = type(self).applied is not StoreSinkCore.applied

    @property
    def _queue(self):
        return self._queue_core

    @_queue.setter
    def _queue(self, QueueCore queue not None):
        self._queue_core = queue
        self._put_overridden = type(queue).put_batch is not _CORE_PUT_BATCH

    def _forget_state(self, stream):
        """The stream's state goes (`forget`)."""
        self._streams.pop(stream, None)
        self._recent_streams[:] = [None] * _RECENT
        self._recent_states[:] = [None] * _RECENT

    def instant(self, stream, ts, view):
        """The map at each second's end (rollups) and at each recovery offset
        (`EventSink.instant`); the next call is wanted at the end of the second or the next
        offset, whichever comes first. While no recovery is followed (nearly always), in C:
        the rollup's rows put and its span handed back with no Python frame but the rows'."""
        cdef StreamState state = _state_of(self, stream)
        if state.recoveries.followed:
            return self._instant_followed(state, stream, ts, view)
        rollup = state.rollup
        if isinstance(rollup, SecondCore):
            rows = (<SecondCore>rollup).rows_before(view, ts)
        else:
            rows = rollup.instant(view, ts)
        for row in rows:
            if self._put_overridden:
                self._queue_core.put_batch(row, 0)
            else:
                self._queue_core.put_row(row, 0)
        if isinstance(rollup, SecondCore):
            return (<SecondCore>rollup).span_of()
        return rollup.span()

    def applied(self, batch):
        """After each batch changed the map (`EventSink.applied`)."""
        self.told(
            batch.stream, batch.epoch, batch.seq, batch.ts, batch.recv_ts, batch.payload,
            batch.decoded, batch.changes, batch.gaps, batch.view, batch,
        )

    cdef int batch_applied(self, object stream, object epoch, object seq, object ts,
                           object recv_ts, object payload, object decoded, object changes,
                           object gaps, object view) except -1:
        if self._applied_overridden:
            return LiveSink.batch_applied(
                self, stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view
            )
        return self.told(
            stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view, None
        )

    cdef int told(self, object stream, object epoch, object seq, object ts, object recv_ts,
                  object payload, object decoded, object changes, object gaps, object view,
                  object batch) except -1:
        """Every batch (`batch`: its `AppliedBatch`, if it came as one): each test is the
        cheapest that says there is nothing to do."""
        cdef StreamState state
        cdef long long events
        cdef bint put
        cdef Py_ssize_t place = (<Py_ssize_t>(<uintptr_t><PyObject*>stream >> 4)) & (_RECENT - 1)
        # `_state_of`, its common case inline (gcc leaves the function a call).
        if PyList_GET_ITEM(self._recent_streams, place) == <PyObject*>stream:
            state = <StreamState><object>PyList_GET_ITEM(self._recent_states, place)
        else:
            state = _state_of(self, stream)
        if state.epoch is not epoch and state.epoch != epoch:
            state.epoch = epoch
            self._put_always(_EPOCH_ROW(stream, epoch, recv_ts))
        # Counted into the second's rollup; the block-events it counted pace checkpoints.
        events = state.counts.counted(view, gaps, changes)
        if state.recoveries.followed:
            # Before the batch's log row: a store that holds the batch holds what it made known.
            if batch is None:
                batch = _applied_batch(
                    stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view
                )
            for recovery in state.recoveries.after_batch(batch):
                self._put_always(recovery)
        row = (stream, epoch, seq, ts, recv_ts, payload)
        if self._put_overridden:
            put = self._queue_core.put_batch(row, len(payload))
        else:
            put = self._queue_core.put_row(row, len(payload))
        if not put:
            self._note_drop(stream, state, epoch, seq, ts)
        elif state.dropped_from is not None:
            self._close_drop(stream, state)
        if state.pacer.counted(events) and state.dropped_from is None:
            if batch is None:
                batch = _applied_batch(
                    stream, epoch, seq, ts, recv_ts, payload, decoded, changes, gaps, view
                )
            self._checkpoint(batch, state)
        return 0


cdef inline StreamState _state_of(StoreSinkCore sink, object stream):
    """The stream's state: its recent place's, else `_streams`'s, else a new one."""
    cdef Py_ssize_t place = (<Py_ssize_t>(<uintptr_t><PyObject*>stream >> 4)) & (_RECENT - 1)
    if PyList_GET_ITEM(sink._recent_streams, place) == <PyObject*>stream:
        return <StreamState><object>PyList_GET_ITEM(sink._recent_states, place)
    found = sink._streams.get(stream)
    state = sink._state(stream) if found is None else found
    sink._recent_streams[place] = stream
    sink._recent_states[place] = state
    return state
