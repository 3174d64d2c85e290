"""The freed heap back to the OS once the store's backlog has drained.

CPython frees a drained queue's payloads to the C allocator, which keeps their pages: after a
store outage or a burst of large batches the process stayed hundreds of MiB larger although
it held nothing. glibc's `malloc_trim(0)` returns the free pages of every arena. Elsewhere (musl,
macOS) there is no such call and nothing is done.

`malloc_trim` leaves the top of a thread's arena alone, though: glibc gives that back on a free
only past its trim threshold, which it raises (with its mmap threshold) each time a large
mapped block is freed, up to 64 MiB. The writer thread's large blocks (a checkpoint's copy, its
known hashes as they are made) then stayed resident once freed. `pin_thresholds` fixes both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from functools import cache


@cache
def _libc(function: str) -> Callable[..., int] | None:
    """The C library's `function`, or None where it has none (not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


PINNED_THRESHOLD = 4 << 20
"""Blocks this large are mapped apart (and unmapped when freed), and an arena's free top past
it goes back to the OS: few blocks are, so few calls are made."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def pin_thresholds() -> bool:
    """Fix glibc's trim and mmap thresholds at `PINNED_THRESHOLD` (no longer raised by large
    frees); False where they cannot be set (not glibc)."""
    if _libc("malloc_trim") is None:  # mallopt is glibc's; musl's takes nothing and says so
        return False
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_TRIM_THRESHOLD, PINNED_THRESHOLD)
        and mallopt(_M_MMAP_THRESHOLD, PINNED_THRESHOLD)
    )


def trim_heap() -> bool:
    """Ask the allocator to return its free pages; False where it cannot be asked."""
    trim = _libc("malloc_trim")
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
