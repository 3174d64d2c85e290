# cython: language_level=3
"""A stream's live path in C: `live_frames` (one message in order) and `_apply` (a batch whose
seq is known good, applied from its bytes where it can be). They run for every live message,
where their two Python frames and bytecodes cost more than what they do.

`LiveIngest` is the base of collector/ingest.py's `StreamIngest` (through `FusedIngest`,
collector/ingest_fused.py): the state these read for every message is in its fields, read in C;
what they call besides (`_accept`, `_apply_decoded`, `_degrade`, `_failed`, the replay's rules)
are the Python subclass's methods.
"""

cimport cython
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE

from kvscope.collector._live_sink cimport BatchChanges, LiveSink
from kvscope.collector._replay cimport FusedApply
from kvscope.collector._slot_attr cimport slot_get, slot_set
from kvscope.collector.degraded import Degradation
from kvscope.collector.errors import MalformedKind
from kvscope.collector.recent import KEPT_BYTES, kept
from kvscope.collector.replay import SEQ_BYTES, can_hold, hold
from kvscope.collector.sink import AppliedBatch
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import Batch
from kvscope.collector.wire import MAP_LAYOUT

cdef object _FRAME_COUNT = MalformedKind.FRAME_COUNT
cdef object _OVERSIZE = MalformedKind.OVERSIZE
cdef object _MAP_LAYOUT = MAP_LAYOUT
cdef object _BATCH = Batch
cdef object _APPLIED_BATCH = AppliedBatch
cdef object _kept = kept
cdef object _can_hold = can_hold
cdef object _hold = hold
cdef Py_ssize_t _KEPT_BYTES = KEPT_BYTES
cdef Py_ssize_t _SEQ_BYTES = SEQ_BYTES
cdef object _MAX_SEQ = 2**63 - 1
# `StreamCounters`' slots written for every batch, through their descriptors (_slot_attr.pxd).
cdef object _STREAM_COUNTERS = StreamCounters
cdef object _BATCHES_APPLIED = StreamCounters.__dict__["batches_applied"]
cdef object _GAPS = StreamCounters.__dict__["gaps"]
# `Degradation.open`, read for every batch through its slot's descriptor.
cdef object _DEGRADATION = Degradation
cdef object _DEGRADATION_OPEN = Degradation.__dict__["open"]

SHARED_FUSED = FusedApply()
"""What every stream applies the usual batch from its bytes with (each stream's `fused`, a C
field read for every batch, starts as this one)."""


@cython.auto_pickle(False)
cdef class LiveIngest:
    """The fields `live_frames` and `_apply` read (see `StreamIngest` for what each holds)."""

    # (its fields: collector/_ingest_live.pxd)

    def __cinit__(self, *args, **kwargs):
        self.fused = SHARED_FUSED

    property stream:
        """The stream's `StreamId`; its rank kept beside it, to check each batch's against."""

        def __get__(self):
            return self._stream

        def __set__(self, stream):
            self._stream = stream
            self._stream_rank = stream.rank

    property decoder:
        """The stream's `BatchDecoder`; its limit and layouts (fixed for each) kept beside it."""

        def __get__(self):
            return self._decoder

        def __set__(self, decoder):
            self._decoder = decoder
            self._max_block_size = decoder.max_block_size
            self._layouts = decoder.layouts

    property _recent:
        """The stream's `RecentBatches`; its deque's `append` is kept beside it (the deque is
        never replaced), called here for each batch applied."""

        def __get__(self):
            return self._recent_obj

        def __set__(self, recent):
            self._recent_obj = recent
            self._recent_append = recent.batches.append

    def live_frames(self, frames, now, decoded=None):
        """`live`: one message from the SUB socket (see there)."""
        return self.live(frames, now, decoded)

    cdef live(self, frames, now, decoded):
        """One message from the SUB socket: [topic, seq, payload]. `decoded`: its batch, if the
        fleet's router decoded it already (`BatchDecoder.decode`), with the seq it read from
        this message's seq frame; or read it (`FleetRouter.route_batch`), to apply from its
        bytes."""
        cdef object seq, seq_frame, payload, read
        try:
            self.last_message_at = now
            self._messages += 1
            if len(frames) != 3:
                self._malformed(_FRAME_COUNT, None, f"{len(frames)} frames")
                return None
            _topic, seq_frame, payload = frames
            # The seq as the router read it from this frame (-1: it did not), else as
            # `_seq_of` reads it, without its call when the frame is good.
            if isinstance(decoded, FusedApply):
                seq = (<FusedApply>decoded).seq_read(payload)
            elif decoded is not None and decoded.seq <= _MAX_SEQ:
                seq = decoded.seq
            else:
                seq = -1
            if seq < 0:
                if len(seq_frame) == _SEQ_BYTES and seq_frame[0] < 0x80:  # <= MAX_SEQ
                    seq = int.from_bytes(seq_frame, "big")
                else:
                    read = self._seq_of(seq_frame)
                    if read is None:
                        return None
                    seq = read
            if self._replay is not None:
                if _can_hold(self._replay, payload):
                    _hold(self._replay, [(seq, payload)])
                    return None
                self._replay_failed("too many live batches held during replay", now)
            if self._replay is not None:
                _hold(self._replay, [(seq, payload)])  # a replay asked for while releasing
            elif seq == self.expected:
                # in order, nearly every batch: no rules to weigh
                self.apply_known(seq, payload, now, decoded)
            else:
                self._accept(seq, payload, now)
        except Exception as exc:  # one batch must not stop the stream
            self._failed("live", exc, frames, now)
        if self._outbox is None:  # (`take_replay_request`, without its call)
            return None
        return self.take_replay_request()

    def _apply(self, seq, payload, now, decoded=None):
        """Apply the batch `seq` (its seq known good): `apply_known`."""
        self.apply_known(seq, payload, now, decoded)

    cdef apply_known(self, seq, payload, now, decoded):
        """Apply the batch `seq` (its seq known good). `decoded`: the batch as the fleet's
        router decoded or read it. For a stream whose engine is told already, decoded and
        applied in one pass over its bytes (`FusedApply`) where it can be, else left to
        `_apply_decoded`. A sink is told as `_apply_decoded` tells it: `instant` before the
        map changes, when due, and `applied` after, with the changes counted during the apply
        and no `Batch` (`AppliedBatch.batch` decodes one for a sink that reads it)."""
        cdef Py_ssize_t size
        cdef long long applied = -1, rank
        cdef bint degraded = False, live_sink = False
        cdef long long gaps
        cdef object fused, sink, max_block_size, reader, read_ts, ts = None, quiet
        cdef object counters, changes = None, told, since, until, degradation, nbytes
        self.expected = seq + 1
        self.last_seq = seq
        size = len(payload)
        nbytes = size  # (one int object, for the batch kept and the limit's test)
        # `self._recent.add`, without its call; `kept` only for a large payload.
        self._recent_append((seq, nbytes, payload if size <= _KEPT_BYTES else _kept(payload)))
        if nbytes > self.max_message_bytes:
            self._malformed(_OVERSIZE, seq, f"{size} bytes")
            self._degrade("oversize batch dropped", seq, seq, now)
            return None
        if type(decoded) is _BATCH:  # (isinstance asks msgspec's metaclass: it costs more)
            self._apply_decoded(seq, payload, now, decoded)
            return None
        fused = self.fused
        sink = self.sink
        if self.engine is not None and fused is not None:
            degradation = self._degradation
            degraded = bool(
                slot_get(_DEGRADATION_OPEN, degradation) if type(degradation) is _DEGRADATION
                else degradation.open
            )
            max_block_size = self._max_block_size
            if sink is None and decoded is not None:
                if isinstance(decoded, FusedApply):
                    told = (<FusedApply>decoded).apply_read(
                        self.map, payload, seq, self.epoch, degraded, now, max_block_size
                    )
                else:  # (a `Batch` went to `_apply_decoded` above)
                    told = decoded.apply_read(
                        self.map, payload, seq, self.epoch, degraded, now, max_block_size
                    )
                applied = told
            elif sink is None:
                told = fused.live(self.map, payload, seq, self.epoch, degraded, now, max_block_size)
                applied = told
            else:
                # Asked once, for both of its tests below: a sink's class walks its bases to
                # say (the store's writer has several).
                live_sink = isinstance(sink, LiveSink)
                reader = decoded if decoded is not None else fused
                if isinstance(reader, FusedApply):  # (its C calls, not its Python ones)
                    read_ts = (<FusedApply>reader).prepare(
                        self.map, payload, self.epoch, degraded, now, max_block_size
                    )
                else:
                    read_ts = reader.prepare(
                        self.map, payload, self.epoch, degraded, now, max_block_size
                    )
                if read_ts is not None:
                    ts = read_ts
                    try:
                        quiet = self._quiet
                        # A `Span`'s bounds read as a tuple's items: indexing a subclass of
                        # tuple goes through a Python-level `__getitem__` call.
                        if PyTuple_Check(quiet) and PyTuple_GET_SIZE(quiet) == 2:
                            since = <object>PyTuple_GET_ITEM(quiet, 0)
                            until = <object>PyTuple_GET_ITEM(quiet, 1)
                        else:
                            since, until = quiet[0], quiet[1]
                        if not since <= ts < until:
                            self._quiet = sink.instant(self._stream, ts, self.map)
                    except BaseException:
                        reader.release()
                        raise
                    if isinstance(reader, FusedApply):
                        if live_sink:  # counted in C: no dict nor lists
                            if self._changes is None:
                                self._changes = BatchChanges()
                            self._changes.reset()
                            changes = self._changes
                        else:
                            changes = {}
                        told = (<FusedApply>reader).apply_prepared(seq, changes)
                    else:
                        changes = {}
                        told = reader.apply_prepared(seq, changes)
                    applied = told
        if applied < 0:
            # What the router read, as a `Batch` (for the sink, or the engine to be told).
            batch = None
            if decoded is not None:
                batch = decoded.batch(payload, seq, self._max_block_size)
            self._apply_decoded(seq, payload, now, batch)
            return None
        if self._layouts[0] is not _MAP_LAYOUT:  # (nearly never)
            self._decoder.took_map_layout()
        counters = self.counters
        rank = (applied >> 1) - 1  # -1: none
        if rank >= 0 and rank != self._stream_rank:
            counters.rank_mismatches += 1
        if type(counters) is _STREAM_COUNTERS:  # (no lookup of the name in the class)
            slot_set(_BATCHES_APPLIED, counters, slot_get(_BATCHES_APPLIED, counters) + 1)
        else:
            counters.batches_applied += 1
        if degraded and applied & 1:
            self._degradation.known_again(seq, now)
        if sink is not None:  # `_tell_applied`, inline
            # The stream's gaps, and those told, as C ints: only the difference is handed on.
            gaps = (
                slot_get(_GAPS, counters) if type(counters) is _STREAM_COUNTERS
                else counters.gaps
            )
            if live_sink:  # told in C, with no `AppliedBatch` built for it
                (<LiveSink>sink).batch_applied(
                    self._stream, self.epoch, seq, ts, now, payload, None, changes,
                    gaps - self._gaps_told, self.map,
                )
            else:
                sink.applied(
                    _APPLIED_BATCH(
                        self._stream,
                        self.epoch,
                        seq,
                        ts,
                        now,
                        payload,
                        None,
                        changes,
                        gaps - self._gaps_told,
                        self.map,
                    )
                )
            self._gaps_told = gaps
        return None
