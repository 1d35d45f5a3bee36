"""Host-process housekeeping.

XLA's compiler allocates and frees a lot of host memory while it builds an executable; glibc
keeps the freed pages in its arenas, so the process's resident memory stays near the
compiler's peak for the rest of the run; :func:`release_freed_memory` hands them back
(docs/benchmarks.md measures what it saves).

Float64 numbers the host needs (the light cone's distances, prior inverses) are computed on
the host's CPU under :func:`cpu_float64`, whatever the default device: a TPU emulates float64,
and compiling one such table lookup took 153 s there (2026-12-06, docs/muse_studies.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools

import jax

__all__ = ["cpu_float64", "release_freed_memory"]


@contextlib.contextmanager
def cpu_float64():
    """Float64 enabled, and the CPU as the default device where the process has one
    (``JAX_PLATFORMS`` may leave it out): for small host-side computations on concrete values."""
    try:  # this process's own: in a multi-process run jax.devices() lists every process's
        cpu = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        cpu = None
    with jax.enable_x64(True), (jax.default_device(cpu) if cpu is not None else contextlib.nullcontext()):
        yield


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
