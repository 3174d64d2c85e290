"""`MapCore` (collector/_map_core.pyx), declared for the compiled paths that read a map's fields
for each batch (collector/_replay.pyx)."""


cdef class MapCore:
    cdef public object tables, counters, limits
