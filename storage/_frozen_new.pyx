# A frozen dataclass's instance made without its `__init__`: a reset follower's answer makes a
# `PrefixGroup` per group at every offset reached, and a frozen dataclass's `__init__` sets
# each field through `object.__setattr__`, a Python call apiece.
from cpython.object cimport PyObject_GenericSetAttr


def frozen_new(cls, tuple names, tuple values):
    """`cls(*values)` for a frozen dataclass `cls` with fields `names` (in order) and no
    `__post_init__`: each field set as its `__init__` would set it."""
    if len(names) != len(values):
        raise TypeError(f"{len(names)} fields, {len(values)} values")
    obj = cls.__new__(cls)
    cdef Py_ssize_t i
    for i in range(len(names)):
        PyObject_GenericSetAttr(obj, names[i], values[i])
    return obj
