"""The freed heap back to the OS once the store's backlog has drained.

CPython frees a drained queue's payloads to the C allocator, which keeps their pages: after a
store outage or a burst of large batches the process stayed hundreds of MiB larger although
it held nothing. glibc's `malloc_trim(0)` returns the free pages of every arena. Elsewhere (musl,
macOS) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Ask the allocator to return its free pages; False where it cannot be asked."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def rss_bytes() -> int | None:
    """This process's resident memory (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
