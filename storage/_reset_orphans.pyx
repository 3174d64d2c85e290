# A reset's orphans followed through one batch (storage/reset_orphans.py's `Orphans.after`), in
# Cython: the follower calls it for every batch it replays, and in Python its steps per event
# and per block (the record of what was stored under what, the removals' checks) were most of
# a follower's advance. The same steps in the same order: the rare ones (an orphan found, one
# settled) call back the `Orphans` methods.
from kvscope.collector.types import BlocksRemoved, BlocksStored

cdef object _STORED = BlocksStored
cdef object _REMOVED = BlocksRemoved


cdef int _add_chain(dict under, object parent, object hashes) except -1:
    """Each of `hashes` stored under the one before it, the first under `parent` (None: none):
    one child an int, more a set (`reset_orphans.add_chain`)."""
    cdef object kids
    for h in hashes:
        if parent is not None:
            kids = under.get(parent)
            if kids is None:
                under[parent] = h
            elif type(kids) is set:
                (<set>kids).add(h)
            elif kids != h:
                under[parent] = {kids, h}
        parent = h
    return 0


def add_chain(dict under, parent, hashes):
    _add_chain(under, parent, hashes)


def orphans_after(orphans, view, events, ts):
    """`Orphans.after(view, events, ts)`."""
    cdef dict removed = {}
    cdef list stored = []
    cdef bint cleared = False
    cdef object kind, gone, key, hashes, named, table, head, kids, parent
    cdef dict under
    cdef Py_ssize_t added = 0
    for event in events:
        # By exact type, as the map applies them (collector/_map_apply.pyx).
        kind = type(event)
        if kind is _STORED:
            stored.append(event)
        elif kind is _REMOVED:
            key = event.table
            gone = removed.get(key)
            if gone is None:
                gone = removed[key] = set()
            (<set>gone).update(event.hashes)
        else:
            cleared = True
    cdef dict opened = orphans._open
    if opened:  # (none open: none to close, whatever the batch did)
        orphans._rejoined_or_removed(view, removed, stored, cleared, ts)
    cdef dict tables = view.tables
    cdef dict children = orphans._children
    cdef list found = orphans.found
    for event in stored:
        key = event.table
        hashes = event.hashes
        found_under = children.get(key)
        if found_under is None:
            found_under = children[key] = {}
        under = <dict>found_under
        named = event.parent
        _add_chain(under, named, hashes)
        added += len(hashes)
        if not hashes or named is None:
            continue
        table = tables.get(key)
        if table is None:
            continue
        head = hashes[0]
        if head not in table or named in table or (key, head) in opened:
            continue
        gone = removed.get(key)
        if gone is not None and named in <set>gone:
            continue  # stored under a cached parent this batch removed: below
        found.append(orphans._entry(table, head, named, ts))
    orphans.children += added
    if not removed:
        return
    cdef set seen = orphans._seen_evicted
    cdef list evicted = orphans.evicted
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
