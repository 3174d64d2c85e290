# A slot of a Python class (`__slots__`, a dataclass's `slots=True`) read and written through
# its member descriptor, found once: for an object of exactly that class, what `obj.name` and
# `obj.name = value` do, without looking the name up in the class's MRO each time (the live
# path reads a few such slots for every message).

from cpython.object cimport Py_TYPE, PyTypeObject


cdef inline object slot_get(object descriptor, object obj):
    """`obj.<descriptor's name>`: `obj` of the class the descriptor was taken from."""
    return Py_TYPE(descriptor).tp_descr_get(descriptor, obj, <object>Py_TYPE(obj))


cdef inline int slot_set(object descriptor, object obj, object value) except -1:
    """`obj.<descriptor's name> = value`: `obj` of the class the descriptor was taken from."""
    return Py_TYPE(descriptor).tp_descr_set(descriptor, obj, value)
