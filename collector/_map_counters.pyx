# cython: language_level=3
"""`MapCounters`: what a map has applied since it was made, as C fields.

Every batch adds to them (collector/_map_apply.pyx, and the fused path of _replay.pyx), so they
are compiled: those paths count a batch into a `Counts` (_map_counters.pxd) and add it with
`add`, where a Python object took an attribute read and write per field. Python reads and writes
each field as an attribute; `as_dict` is what serialises them.
"""


cdef class MapCounters:
    """A map's batches, events and blocks applied, clears, the last batch's `ts`, and whether
    its publisher sent signed hashes."""

    def __init__(self):
        self.last_ts = None

    cdef int add(self, Counts* k) except -1:
        """Add `k` and zero it."""
        self.batches += k.batches
        self.stored_events += k.stored_events
        self.removed_events += k.removed_events
        self.cleared_events += k.cleared_events
        self.stored_blocks += k.stored_blocks
        self.removed_blocks += k.removed_blocks
        if k.signed_hashes:
            self.signed_hashes = True  # kept across clears, as the publisher's wire is
        k.batches = k.stored_events = k.removed_events = k.cleared_events = 0
        k.stored_blocks = k.removed_blocks = 0
        k.signed_hashes = False
        return 0

    def as_dict(self):
        """Every field by name, in the order they are declared."""
        return {
            "batches": self.batches,
            "stored_events": self.stored_events,
            "removed_events": self.removed_events,
            "cleared_events": self.cleared_events,
            "stored_blocks": self.stored_blocks,
            "removed_blocks": self.removed_blocks,
            "clears": self.clears,
            "last_ts": self.last_ts,
            "signed_hashes": self.signed_hashes,
        }

    def __eq__(self, other):
        if type(other) is not MapCounters:
            return NotImplemented
        return self.as_dict() == (<MapCounters>other).as_dict()

    def __repr__(self):
        fields = ", ".join(f"{name}={value!r}" for name, value in self.as_dict().items())
        return f"MapCounters({fields})"
