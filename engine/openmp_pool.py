"""Freeing a thread's OpenMP workers, so that the engine's thread holds the process's one OpenMP team.

libgomp (torch's OpenMP runtime) keeps a pool of worker threads for every thread that ran a parallel
region. Once the process holds more of them than it has CPUs, a worker spins only 100 turns after a
region before it sleeps (``GOMP_SPINCOUNT`` no longer counts), so each of a forward pass's ~400
regions wakes a sleeping thread. A model loaded and checked on one thread and served on the engine's
is that case (figures: docs/benchmarks/native/README.md). ``omp_pause_resource_all`` (OpenMP 5.0)
frees the calling thread's pool; a later region there builds a new one. A background thread can
instead run every region alone (``omp_set_num_threads(1)`` for that thread: :func:`run_alone`). A
process may hold several libgomps (scikit-learn's wheel bundles its own, which sentence-transformers
loads), each with its own pools and count, so both go to every libgomp loaded, torch's among them.
Runtimes other than libgomp, or none loaded, make them no-ops.

Example:
    >>> release_thread_pool() in (True, False)
    True
    >>> import threading; t = threading.Thread(target=run_alone); t.start(); t.join()
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


def _loaded_runtimes() -> list[ctypes.CDLL]:
    if not _runtimes:
        libs = (ctypes.CDLL(path) for path in loaded_libgomps())
        _runtimes.extend(lib for lib in libs if hasattr(lib, "omp_pause_resource_all"))
    return _runtimes


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP workers in every libgomp loaded (not inside a parallel
    region); whether one did."""
    released = [lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0 for lib in _loaded_runtimes()]
    return any(released)  # every runtime released, not any()'s first alone


def run_alone() -> None:
    """Make the calling thread's parallel regions (torch's, oneDNN's) run on it alone, in every
    libgomp loaded: it never holds a team, so it never throttles the engine's (for background
    threads, such as a KV tier's writer)."""
    import torch

    torch.get_num_threads()  # torch's own setup of this thread first: it would set the count again
    release_thread_pool()
    for lib in _loaded_runtimes():
        lib.omp_set_num_threads(1)
