# A reset's orphans followed through one batch (storage/reset_orphans.py's `Orphans.after`), in
# Cython: the follower calls it for every batch it replays, and in Python its steps per event
# and per block (the record of what was stored under what, the removals' checks) were most of
# a follower's advance. The same steps in the same order: the rare ones (an orphan found, one
# settled) call back the `Orphans` methods. `follow_batches` is the advance's loop itself.
from itertools import chain

from cpython.dict cimport PyDict_SetDefault
from cpython.long cimport PyLong_FromUnsignedLongLong
from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t

from kvscope.collector._fused_read cimport BatchRead, Op
from kvscope.collector._replay cimport FusedApply
from kvscope.collector._table_core cimport TableCore
from kvscope.collector._wire_scan cimport CLEARED, STORED

from kvscope.collector.types import BlocksRemoved, BlocksStored

cdef object _STORED = BlocksStored
cdef object _REMOVED = BlocksRemoved


cdef inline int _add_child(dict under, object parent, object h) except -1:
    """`h` stored under `parent`: one child an int, more a set."""
    # One lookup where the parent has no child yet (most): the dict's setdefault.
    cdef object kids = <object>PyDict_SetDefault(under, parent, h)
    if kids is h:
        return 0
    if type(kids) is set:
        (<set>kids).add(h)
    elif kids != h:
        under[parent] = {kids, h}
    return 0


cdef int _add_chain(dict under, object parent, object hashes) except -1:
    """Each of `hashes` stored under the one before it, the first under `parent` (None: none):
    one child an int, more a set (`reset_orphans.add_chain`)."""
    for h in hashes:
        if parent is not None:
            _add_child(under, parent, h)
        parent = h
    return 0


cdef object _add_read_chain(dict under, object parent, const uint64_t* hashes, Py_ssize_t n):
    """`_add_chain` of hashes as the fused read holds them (C values): the first one's int
    (None: none)."""
    cdef object h, head = None
    cdef Py_ssize_t k
    for k in range(n):
        h = PyLong_FromUnsignedLongLong(hashes[k])
        if k == 0:
            head = h
        if parent is not None:
            _add_child(under, parent, h)
        parent = h
    return head


cdef inline object _set_at(dict within, object key):
    """`within[key]`, a new set put there where none is."""
    cdef object found = within.get(key)
    if found is None:
        found = within[key] = set()
    return found


cdef inline dict _dict_at(dict within, object key):
    """`within[key]`, a new dict put there where none is."""
    cdef object found = within.get(key)
    if found is None:
        found = within[key] = {}
    return <dict>found


cdef inline int _orphan_stored(
    orphans, list found, dict opened, dict removed, table, key, head, named, ts
) except -1:
    """`head` stored under `named`, which its table does not cache while it caches `head`: an
    orphan, unless one is open for it already or this batch removed `named` (`_evicted`
    records those)."""
    if (key, head) in opened:
        return 0
    gone = removed.get(key)
    if gone is not None and named in <set>gone:
        return 0
    found.append(orphans._entry(table, head, named, ts))
    return 0


def add_chain(dict under, parent, hashes):
    _add_chain(under, parent, hashes)


def orphans_after(orphans, view, events, ts):
    """`Orphans.after(view, events, ts)`."""
    _orphans_after(orphans, view, events, ts)


cdef int _orphans_after(orphans, view, events, ts) except -1:
    cdef dict removed = {}
    cdef list stored = []
    cdef bint cleared = False
    cdef object kind, key, hashes, named, table, head
    cdef Py_ssize_t added = 0
    for event in events:
        # By exact type, as the map applies them (collector/_map_apply.pyx).
        kind = type(event)
        if kind is _STORED:
            stored.append(event)
        elif kind is _REMOVED:
            (<set>_set_at(removed, event.table)).update(event.hashes)
        else:
            cleared = True
    cdef dict opened = orphans._open
    if opened:  # (none open: none to close, whatever the batch did)
        orphans._rejoined_or_removed(
            view, removed, [(event.table, event.hashes) for event in stored], cleared, ts
        )
    cdef dict tables = view.tables
    cdef dict children = orphans._children
    cdef list found = orphans.found
    for event in stored:
        key = event.table
        hashes = event.hashes
        named = event.parent
        _add_chain(_dict_at(children, key), named, hashes)
        added += len(hashes)
        if not hashes or named is None:
            continue
        table = tables.get(key)
        if table is None:
            continue
        head = hashes[0]
        if head in table and named not in table:
            _orphan_stored(orphans, found, opened, removed, table, key, head, named, ts)
    orphans.children += added
    if removed:
        _evicted(orphans, tables, children, removed, opened, ts)
    return 0


cdef int _evicted(orphans, dict tables, dict children, dict removed, dict opened, ts) except -1:
    """The blocks stored since the clear under a parent a batch removed (`removed`), left
    cached without it: orphaned by eviction, each recorded once."""
    cdef set seen = orphans._seen_evicted
    cdef list evicted = orphans.evicted
    cdef object key, gone, table, found_under, parent, kids
    cdef dict under
    for key, gone in removed.items():
        table = tables.get(key)
        found_under = children.get(key)
        if table is None or found_under is None:
            continue
        under = <dict>found_under
        for parent in sorted(<set>gone):
            if parent in table:
                continue
            kids = under.pop(parent, None)
            if kids is None:
                continue
            for h in (sorted(<set>kids) if type(kids) is set else (kids,)):
                if h not in table or table.parent_of(h) != parent or (key, h) in opened:
                    continue
                if (key, h) not in seen:
                    seen.add((key, h))
                    evicted.append(orphans._entry(table, h, parent, ts))
    return 0


cdef list _read_hashes(BatchRead read, Op* op):
    return [PyLong_FromUnsignedLongLong(read.hashes[k])
            for k in range(op.hashes, op.hashes + op.n_hashes)]


cdef Py_ssize_t _orphans_after_read(
    orphans, view, BatchRead read, ts, dict opened, dict children, list found
) except -1:
    """`_orphans_after` of the batch `read` holds, just applied: from its ops, the hashes as
    C values until a dict or set needs them, no events built. `opened`, `children`, `found`:
    the orphans' (read once per loop, not per batch). Returns the blocks to add to
    `orphans.children` (added once per loop)."""
    cdef dict removed = {}
    cdef list stored
    cdef bint cleared = False
    cdef Py_ssize_t i, k
    cdef Op* op
    cdef object key, gone, named, head, table
    cdef TableCore core
    cdef Py_ssize_t added = 0
    for i in range(read.n_ops):
        op = &read.ops[i]
        if op.kind == CLEARED:
            cleared = True
        elif op.kind != STORED:
            gone = _set_at(removed, read.keys[op.key])
            for k in range(op.hashes, op.hashes + op.n_hashes):
                (<set>gone).add(PyLong_FromUnsignedLongLong(read.hashes[k]))
    if opened:  # (none open: none to close, whatever the batch did)
        stored = [
            (read.keys[read.ops[i].key], _read_hashes(read, &read.ops[i]))
            for i in range(read.n_ops) if read.ops[i].kind == STORED
        ]
        orphans._rejoined_or_removed(view, removed, stored, cleared, ts)
    cdef dict tables = view.tables
    for i in range(read.n_ops):
        op = &read.ops[i]
        if op.kind != STORED:
            continue
        key = read.keys[op.key]
        named = PyLong_FromUnsignedLongLong(op.parent) if op.has_parent else None
        head = _add_read_chain(
            _dict_at(children, key), named, &read.hashes[op.hashes], op.n_hashes
        )
        added += op.n_hashes
        if op.n_hashes == 0 or named is None:
            continue
        table = tables.get(key)
        if table is None:
            continue
        core = <TableCore?>table
        # `head in table and named not in table`, on the C values
        if core._slot_of._find(read.hashes[op.hashes]) >= 0 and core._slot_of._find(op.parent) < 0:
            _orphan_stored(orphans, found, opened, removed, table, key, head, named, ts)
    if removed:
        _evicted(orphans, tables, children, removed, opened, ts)
    return added


def follow_batches(follower, batches, double last_instant, bint rows):
    """`ResetFollower.advance`'s loop over `batches` (in order; `rows`: `LogRow`s, as the
    writer holds them, else `LoggedBatch`es): each batch up to `last_instant` applied to the
    follower's map and its orphans followed through it, the states taken at the offsets it
    passes. Each batch is applied from its bytes (as `replay` does) and its orphans followed
    from that read (its ops, no events built); one the compiled read does not take is decoded,
    applied and followed from its events.
    Returns the batches left (the first past `last_instant`, and the rest), or None."""
    view, epoch, orphans = follower.view, follower.epoch, follower.orphans
    decoder = follower._decoder
    cdef list states = follower.states
    cdef FusedApply state = FusedApply()
    state.bind(view, epoch, False, None, decoder.max_block_size)
    cdef double ts, next_instant = follower._next_instant()
    cdef Py_ssize_t replayed = 0, children_added = 0
    cdef dict opened = orphans._open, children = orphans._children
    cdef list found = orphans.found
    # Where a batch's seq, ts and payload are in it (both are tuples: read as such in C).
    cdef Py_ssize_t at_seq = 2 if rows else 0
    cdef Py_ssize_t at_ts = at_seq + 1, at_payload = at_seq + 3
    cdef tuple row
    cdef bint told = False  # the decoder knows the stream speaks the map layout
    last_ts = after = None
    try:
        for batch in batches:
            if not isinstance(batch, tuple):  # (a NamedTuple is one: read as a tuple)
                raise TypeError(f"a batch is a tuple, not {type(batch).__name__}")
            row = <tuple>batch
            ts_value = row[at_ts]
            ts = ts_value
            while ts > next_instant:
                state.flush()  # (the state reads the map's tables only; kept exact anyway)
                states.append(follower._state())
                next_instant = follower._next_instant()
            if ts > last_instant:
                return chain((batch,), batches)  # not applied: fed once a later offset is
            payload, seq = row[at_payload], row[at_seq]
            if state.fused(payload, seq):
                children_added += _orphans_after_read(
                    orphans, view, state, ts_value, opened, children, found
                )
                if not told:  # as its `decode` would have been told
                    decoder.took_map_layout()
                    told = True
            else:
                state.flush()
                decoded = decoder.decode(payload, seq)
                view.apply(decoded, epoch)
                told = False
                _orphans_after(orphans, view, decoded.events, ts_value)
            last_ts, after = ts_value, seq
            replayed += 1
    finally:
        state.flush()
        orphans.children += children_added
        if replayed:
            follower.last_ts, follower.after = last_ts, after
            follower.replayed += replayed
    return None
