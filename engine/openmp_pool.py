"""Freeing a thread's OpenMP workers, so that the engine's thread holds the process's one OpenMP team.

libgomp (torch's OpenMP runtime) keeps a pool of worker threads for every thread that ran a parallel
region. Once the process holds more of them than it has CPUs, a worker spins only 100 turns after a
region before it sleeps (``GOMP_SPINCOUNT`` no longer counts), so each of a forward pass's ~400
regions wakes a sleeping thread. A model loaded and checked on one thread and served on the engine's
is that case (figures: docs/benchmarks/native/README.md). ``omp_pause_resource_all`` (OpenMP 5.0)
frees the calling thread's pool; a later region there builds a new one. A process may hold several
libgomps (scikit-learn's wheel bundles its own, which sentence-transformers loads), each with its own
pools and count, so the release goes to every libgomp loaded, torch's among them. Runtimes other than
libgomp, or none loaded, make it a no-op.

Example:
    >>> release_thread_pool() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
from pathlib import Path

OMP_PAUSE_SOFT = 1


def loaded_libgomps() -> list[str]:
    """The paths of every libgomp this process has loaded, in load order (reads /proc/self/maps: a few
    ms in a large process)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    paths = (line.split()[-1] for line in maps.read_text().splitlines())
    return list(dict.fromkeys(p for p in paths if "libgomp" in Path(p).name))


_runtimes: list[ctypes.CDLL] = []  # found once: the engine package imports torch, so its libgomp is loaded


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP workers in every libgomp loaded (not inside a parallel
    region); whether one did."""
    if not _runtimes:
        libs = (ctypes.CDLL(path) for path in loaded_libgomps())
        _runtimes.extend(lib for lib in libs if hasattr(lib, "omp_pause_resource_all"))
    released = [
        lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0 for lib in _runtimes
    ]  # each, not any()'s first
    return any(released)
