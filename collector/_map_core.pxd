"""`MapCore` (collector/_map_core.pyx), declared for the compiled paths that read a map's fields
for each batch (collector/_replay.pyx)."""


cdef class MapCore:
    cdef public object tables, counters, limits
    # The table of the last key a fused batch wrote to, while `tables` is `cached_tables` (an
    # entry of it is never replaced: a clear replaces the dict): a fleet's streams take turns
    # at one reader, so a cache of the reader's own missed at every batch.
    cdef dict cached_tables
    cdef object cached_key, cached_table
