"""Builds the compiled part of kvscope; everything else is declared in pyproject.toml.

collector/_table_core.pyx is the block table's hash map, hot writes and lookup by tokens;
collector/_wire_fast.pyx decodes the common vLLM batch straight from its msgpack bytes;
collector/_zmq_recv.pyx receives a whole message with libzmq's own calls (all Cython).
Installing kvscope therefore needs a C compiler and the Python headers, as any package with an
extension built from source does.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension("kvscope.collector._table_core", ["collector/_table_core.pyx"]),
            Extension("kvscope.collector._wire_fast", ["collector/_wire_fast.pyx"]),
            # dlopen/dlsym: libdl before glibc 2.34, an empty stub after.
            Extension("kvscope.collector._zmq_recv", ["collector/_zmq_recv.pyx"], libraries=["dl"]),
        ],
        compiler_directives={"language_level": "3"},
    )
)
