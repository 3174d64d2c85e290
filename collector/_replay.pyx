# cython: language_level=3, boundscheck=False, wraparound=False
"""Batches applied to a map straight from their msgpack bytes, as
`PrefixMap.apply(BatchDecoder.decode(...))` would, without the per-event objects and per-hash
ints in between: `replay` for logged batches, `FusedApply` for live ones.

A rebuild (storage/history.py) replays thousands of batches, and a collector applies every live
one; decoding each to a `Batch` and applying that costs mostly objects made only to be read
once. Here a batch the compiled decoder takes (collector/_wire_fast.pyx; its checks are shared
through _wire_checks.pxd, so exactly those batches) is read in two passes over its bytes: the
first (`BatchRead`, collector/_fused_read.pyx) checks all of it and keeps its hashes and tokens
as C values, the second applies them
through the tables' C writes (TableCore._store/_remove, which `store_chain` and `remove` wrap).
A batch that is not the decoder's (another layout, bytes or signed hashes, a LoRA name, extra
keys), or that brings the map near its limits, is left to decode + apply. Nothing is applied
before the whole batch is known good, so the map is the one decode + apply leaves, and raises
where it raises.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t

from kvscope.collector._admit cimport roomy
from kvscope.collector._fused_read cimport BatchRead, Op
from kvscope.collector._live_sink cimport BatchChanges
from kvscope.collector._map_core cimport MapCore
from kvscope.collector._map_counters cimport MapCounters
from kvscope.collector._table_core cimport TableCore
from kvscope.collector._wire_scan cimport CLEARED, STORED

from kvscope.collector.block_table import BlockTable
from kvscope.collector.sink import ClearReason
from kvscope.collector.wire import BatchDecoder

cdef object _ALL_BLOCKS_CLEARED = ClearReason.ALL_BLOCKS_CLEARED


# A map's fields, read in C where it is a `PrefixMap` (a `MapCore`): each batch reads them.
cdef inline object _tables(object prefix_map):
    if isinstance(prefix_map, MapCore):
        return (<MapCore>prefix_map).tables
    return prefix_map.tables


cdef inline object _limits(object prefix_map):
    if isinstance(prefix_map, MapCore):
        return (<MapCore>prefix_map).limits
    return prefix_map.limits


cdef inline object _counters(object prefix_map):
    if isinstance(prefix_map, MapCore):
        return (<MapCore>prefix_map).counters
    return prefix_map.counters


cdef inline int _commit(list counts, Py_ssize_t* stored, Py_ssize_t* removed) except -1:
    """Add a run of events' blocks to their table's `[stored, removed]` (as _map_apply.pyx)."""
    if stored[0]:
        counts[0] += stored[0]
    if removed[0]:
        counts[1] += removed[0]
    stored[0] = removed[0] = 0
    return 0


cdef inline int _count(BatchChanges counter, Py_ssize_t slot, Py_ssize_t* stored,
                       Py_ssize_t* removed) except -1:
    """`_commit`, into a `BatchChanges`."""
    counter.counts[2 * slot] += stored[0]
    counter.counts[2 * slot + 1] += removed[0]
    stored[0] = removed[0] = 0
    return 0


@cython.final
@cython.auto_pickle(False)
cdef class FusedApply(BatchRead):
    """The batches of one map at a time (`replay`, or a live stream's ingest): the batch read by
    the first pass, its scratch buffers kept for the next, and counters not yet added."""

    # (its fields: collector/_replay.pxd)

    cdef int bind(self, prefix_map, epoch, bint degraded, recv_ts,
                  int64_t max_block_size) except -1:
        """The map (its counters flushed first), and how its next batches are applied."""
        if prefix_map is not self.prefix_map:
            self.flush()
            self.prefix_map = prefix_map
        self.limits = _limits(prefix_map)
        self.epoch, self.degraded, self.recv_ts = epoch, degraded, recv_ts
        self.max_block_size = max_block_size
        return 0

    cdef int flush(self) except -1:
        cdef MapCounters c
        if not self.pending:
            return 0
        c = _counters(self.prefix_map)
        c.add(&self.tally)
        c.last_ts = self.last_ts
        self.pending = False
        return 0

    # --- the second pass: `PrefixMap.apply` of the batch read ----------------------------------
    cdef int apply(self, object seq, double ts, object changes, dict tables) except -1:
        """`changes`, if a dict: filled with the batch's `[stored, removed]` blocks per table,
        as `PrefixMap.apply` returns them (a clear leaves both sides of it counted); if a
        `BatchChanges`, the same counted into it. `tables`: the map's, as its caller just read
        them (an attribute read less a batch)."""
        cdef Py_ssize_t i
        cdef Op* op
        cdef MapCore core = (
            <MapCore>self.prefix_map if isinstance(self.prefix_map, MapCore) else None
        )
        cdef TableCore table = None
        cdef object key, ts_value = ts
        cdef object last = None
        if core is not None:  # the map's own: each map keeps its last table
            if tables is core.cached_tables:
                last, table = core.cached_key, core.cached_table
        elif tables is self.last_tables:
            last, table = self.last_table_key, self.last_table
        # The run of events counted into `counts` (the changes of table `counted`), or into
        # `counter`'s slot `slot` (-1: none yet).
        cdef object counted = None
        cdef list counts = None
        cdef BatchChanges counter = None
        cdef dict changes_dict = None
        cdef Py_ssize_t slot = -1
        cdef Py_ssize_t run_stored = 0, run_removed = 0
        if changes is None:
            pass
        elif type(changes) is BatchChanges:
            counter = <BatchChanges>changes
        else:
            changes_dict = changes
        self.tally.batches += 1
        self.last_ts = ts
        self.pending = True
        for i in range(self.n_ops):
            op = &self.ops[i]
            if op.kind == CLEARED:
                if counts is not None:
                    _commit(counts, &run_stored, &run_removed)
                    counts = None
                if slot >= 0:
                    _count(counter, slot, &run_stored, &run_removed)
                    slot = -1
                self.tally.cleared_events += 1
                self.flush()  # what `on_clear` may read
                self.prefix_map.clear(
                    _ALL_BLOCKS_CLEARED, seq, ts_value, self.epoch, self.degraded, self.recv_ts
                )
                tables = _tables(self.prefix_map)  # later events go to the emptied map
                last = counted = table = None  # (the cleared table is not kept)
                self.pending = True  # (last_ts, and what follows)
                continue
            key = self.keys[op.key]
            if key is not last:
                last = key
                table = tables.get(key)
                if table is None:
                    table = tables[key] = BlockTable(key, ts_value)
            if changes is not None and key is not counted:
                counted = key
                if counter is not None:
                    if slot >= 0:
                        _count(counter, slot, &run_stored, &run_removed)
                    slot = counter.slot(key)
                else:
                    if counts is not None:
                        _commit(counts, &run_stored, &run_removed)
                    # the key hashed once, not twice
                    counts = changes_dict.setdefault(key, [0, 0])
            if op.kind == STORED:
                table._store(
                    &self.hashes[op.hashes], op.n_hashes, op.has_parent, op.parent,
                    op.with_tokens, &self.tokens[op.tokens] if op.with_tokens else NULL,
                    op.block_size, ts, None, None, None, None,
                )
                self.tally.stored_events += 1
                self.tally.stored_blocks += op.n_hashes
                run_stored += op.n_hashes
            else:
                table._remove(&self.hashes[op.hashes], op.n_hashes)
                self.tally.removed_events += 1
                self.tally.removed_blocks += op.n_hashes
                run_removed += op.n_hashes
        if counts is not None:
            _commit(counts, &run_stored, &run_removed)
        if slot >= 0:
            _count(counter, slot, &run_stored, &run_removed)
        if core is not None:
            core.cached_tables, core.cached_key, core.cached_table = tables, last, table
        else:
            self.last_tables, self.last_table_key, self.last_table = tables, last, table
        return 0

    cdef bint fused(self, payload, seq) except -1:
        """Apply one batch: True, or False to leave it (untouched) to decode + apply."""
        cdef double ts
        self.read_payload = None  # its read is overwritten
        if type(payload) is not bytes or self.read(payload, &ts) < 0:
            return False
        # As `admit` does first; a batch it would have to count goes the usual way.
        cdef dict tables = _tables(self.prefix_map)
        if not roomy(self.limits, tables, self.n_ops, PyBytes_GET_SIZE(payload)):
            return False
        self.apply(seq, ts, None, tables)
        self.taken += 1
        return True

    def live(self, prefix_map, payload, seq, epoch, bint degraded, recv_ts,
             int64_t max_block_size):
        """Apply one live batch to `prefix_map` as
        `prefix_map.apply(BatchDecoder(limits).decode(payload, seq), epoch, degraded, recv_ts)`
        would (`max_block_size`: that decoder's limit), its counters added: what `told`
        returns; or -1, nothing done, to leave it to decode + apply. One object may serve many
        streams: what a call needs after it returns is in what it returns."""
        if self.busy:
            return -1
        self.busy = True
        try:
            self.bind(prefix_map, epoch, degraded, recv_ts, max_block_size)
            return self.told() if self.fused(payload, seq) else -1
        finally:
            self.flush()
            self.busy = False

    cdef Py_ssize_t told(self):
        """What an applied batch tells the ingest: 2 * (its rank + 1, 0 for None), plus 1 if it
        holds an `AllBlocksCleared`."""
        return 2 * (0 if self.rank_nil else self.rank_value + 1) + self.has_clear

    cpdef route_read(self, seq_frame, payload, int64_t max_block_size):
        """The first pass over a fleet's message, for its router: the rank its batch names (its
        `rank` or 0, as the decoder reads it), or -1 when the batch is not the compiled
        decoder's (or has a LoRA name), or `seq_frame` is not a seq (8 bytes, big-endian,
        <= 2**63 - 1), and it must be decoded. The batch and its seq are kept for `apply_read`
        and `seq_read`."""
        cdef const unsigned char* frame
        cdef uint64_t seq = 0
        cdef Py_ssize_t i
        self.read_payload, self.max_block_size = None, max_block_size
        if type(seq_frame) is not bytes or PyBytes_GET_SIZE(seq_frame) != 8:
            return -1
        frame = <const unsigned char*>PyBytes_AS_STRING(seq_frame)
        for i in range(8):
            seq = (seq << 8) | frame[i]
        if seq >> 63:
            return -1
        self.read_seq = <int64_t>seq
        if type(payload) is not bytes or self.read(payload, &self.read_ts) < 0:
            return -1
        self.read_payload, self.read_max_block_size = payload, max_block_size
        return 0 if self.rank_nil else self.rank_value

    cpdef seq_read(self, payload):
        """The seq of the message `route_read` read last, if `payload` is its batch; else -1."""
        return self.read_seq if payload is self.read_payload else -1

    cpdef apply_read(self, prefix_map, payload, seq, epoch, bint degraded, recv_ts,
                   int64_t max_block_size):
        """`live` for the batch `route_read` read last, if `payload` is that batch read with
        `max_block_size`; -1 (nothing done) to leave it to decode + apply."""
        cdef dict tables
        if payload is not self.read_payload or max_block_size != self.read_max_block_size:
            return -1
        if self.busy:
            return -1
        self.busy = True
        try:
            self.bind(prefix_map, epoch, degraded, recv_ts, max_block_size)
            tables = _tables(self.prefix_map)
            if not roomy(self.limits, tables, self.n_ops, PyBytes_GET_SIZE(payload)):
                return -1
            self.read_payload = None  # applied once
            self.apply(seq, self.read_ts, None, tables)
            self.taken += 1
            return self.told()
        finally:
            self.flush()
            self.busy = False

    cpdef prepare(self, prefix_map, payload, epoch, bint degraded, recv_ts,
                  int64_t max_block_size):
        """The first half of `live` (or of `apply_read`, for the batch `route_read` read last),
        for a stream whose sink is told before the map changes: the batch read (unless it is
        the one read last with `max_block_size`) and found within the map's limits. Its stamp,
        the object then held for `apply_prepared` (or `release`); or None, nothing held, to
        leave it to decode + apply."""
        cdef bint held = False
        if self.busy:
            return None
        self.busy = True  # from the read on: another thread's call meanwhile declines
        try:
            held = self.ready(prefix_map, payload, epoch, degraded, recv_ts, max_block_size)
        finally:
            if not held:
                self.busy = False
        return self.read_ts if held else None

    cdef bint ready(self, prefix_map, payload, epoch, bint degraded, recv_ts,
                    int64_t max_block_size) except -1:
        """`prepare`'s read and check: whether the batch is to be applied here."""
        cdef double ts
        if payload is not self.read_payload or max_block_size != self.read_max_block_size:
            self.read_payload, self.max_block_size = None, max_block_size
            self.read_seq = -1  # the seq route_read read is not this batch's
            if type(payload) is not bytes or self.read(payload, &ts) < 0:
                return False
            self.read_payload, self.read_max_block_size, self.read_ts = (
                payload, max_block_size, ts
            )
        self.bind(prefix_map, epoch, degraded, recv_ts, max_block_size)
        return roomy(self.limits, _tables(self.prefix_map), self.n_ops, PyBytes_GET_SIZE(payload))

    cpdef apply_prepared(self, seq, changes):
        """Apply the batch `prepare` held, filling `changes` (a dict, or a `BatchChanges`) with
        its `[stored, removed]` blocks per table: what `live` returns. With none held, a RuntimeError, and whatever
        was held given up (as `release`): the reader is shared, and must not stay busy."""
        if not self.busy or self.read_payload is None:
            self.release()
            raise RuntimeError("no batch prepared")
        try:
            self.read_payload = None  # applied once
            self.apply(seq, self.read_ts, changes, _tables(self.prefix_map))
            self.taken += 1
            return self.told()
        finally:
            self.flush()
            self.busy = False

    def release(self):
        """Give up the batch `prepare` held (the sink raised before it was applied)."""
        self.read_payload = None
        self.busy = False

    def batch(self, payload, seq, int64_t max_block_size):
        """The `Batch` that `decode_map_batch(payload, seq, max_block_size)` makes, built from
        what `route_read` read of `payload`, for a stream that wants one (its engine not told
        yet); None if the batch read last is not `payload` read with `max_block_size`."""
        if payload is not self.read_payload or max_block_size != self.read_max_block_size:
            return None
        return self.built(payload, seq, self.read_ts)

def replay(prefix_map, payloads, epoch):
    """Apply each (seq, payload) of `payloads` to `prefix_map` as
    `prefix_map.apply(BatchDecoder(prefix_map.limits).decode(payload, seq), epoch)` would: the
    same map, counters and refusals. Returns how many were applied."""
    cdef FusedApply state = FusedApply()
    state.bind(prefix_map, epoch, False, None, prefix_map.limits.max_block_size)
    decode, apply = BatchDecoder(prefix_map.limits).decode, prefix_map.apply
    cdef Py_ssize_t n = 0
    try:
        for seq, payload in payloads:
            if not state.fused(payload, seq):
                state.flush()
                apply(decode(payload, seq), epoch)
            n += 1
    finally:
        state.flush()
    return n
