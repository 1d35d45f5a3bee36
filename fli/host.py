"""Host-process housekeeping.

XLA's compiler allocates and frees a lot of host memory while it builds an executable; glibc
keeps the freed pages in its arenas, so the process's resident memory stays near the
compiler's peak for the rest of the run; :func:`release_freed_memory` hands them back
(docs/benchmarks.md measures what it saves).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_freed_memory"]


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        return None


def release_freed_memory() -> bool:
    """Return the heap that the C allocator holds but no longer uses to the operating system
    (glibc ``malloc_trim(0)``). Call it after compiling, before the long run. Returns False
    where the C library has no such call (nothing is done there)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
