"""Freeing a thread's OpenMP workers, so that the engine's thread holds the process's one OpenMP team.

libgomp (torch's OpenMP runtime) keeps a pool of worker threads for every thread that ran a parallel
region. Once the process holds more of them than it has CPUs, a worker spins only 100 turns after a
region before it sleeps (``GOMP_SPINCOUNT`` no longer counts), so each of a forward pass's ~400
regions wakes a sleeping thread. A model loaded and checked on one thread and served on the engine's
is that case (figures: docs/benchmarks/native/README.md). ``omp_pause_resource_all`` (OpenMP 5.0)
frees the calling thread's pool; a later region there builds a new one. Runtimes other than libgomp,
or none loaded, make it a no-op.

Example:
    >>> release_thread_pool() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

OMP_PAUSE_SOFT = 1


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded (torch's), or None."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        path = line.split()[-1]
        if "libgomp" in Path(path).name:
            lib = ctypes.CDLL(path)
            return lib if hasattr(lib, "omp_pause_resource_all") else None
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP workers (not inside a parallel region); whether it did."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
