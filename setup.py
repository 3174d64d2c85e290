"""Builds the compiled parts of kvscope; everything else is declared in pyproject.toml.

An extension that fails to compile is skipped (`optional=True`): kvscope then runs on its
pure-Python fallbacks (collector/slotmap.py), with the same results and more memory.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("kvscope.collector._slotmap", ["collector/_slotmap.pyx"], optional=True)],
        compiler_directives={"language_level": "3"},
    )
)
