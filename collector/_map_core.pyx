# cython: language_level=3
"""`MapCore`: the base of collector/prefix_map.py's `PrefixMap`, its fields that every live
batch reads (its tables, counters and limits) as C fields.

A fleet's collector applies each message to another stream's map, so nothing read of one map
can be kept for the next batch: the compiled paths (collector/_replay.pyx) read these fields
anew for each, where a Python attribute read looked them up in the type and the instance's
dict. Python reads and writes them as attributes, as before.
"""


cdef class MapCore:
    """`tables` (by `TableKey`), `counters` (its `MapCounters`) and `limits` (`IngestLimits`)."""

    def _forget_cached_table(self):
        """Let go of the table the last fused batch wrote to (collector/_replay.pyx): the map's
        tables were just replaced, and the old ones must not stay alive for the cache alone."""
        self.cached_tables = self.cached_key = self.cached_table = None
