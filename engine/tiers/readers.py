"""ReaderPool: threads that read and decode a prompt's blocks in parallel, each with its own reusable
scratch memory (a block's bytes land in memory that is already faulted in).

Each reader runs its parallel regions alone (``engine.openmp_pool.run_alone``): the pool is the
parallelism, and a team per reader would throttle the engine's.

``run_all`` waits for every call before it returns, also when one fails: a reader still writing into a
request's KV buffer while the engine prefills the same positions would corrupt them.

Example:
    >>> pool = ReaderPool(threads=4, scratch_bytes=1 << 20, name="disk")
    >>> pool.run_all(lambda j, scratch: j * 2, [1, 2, 3])
    [2, 4, 6]
    >>> pool.close()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from engine.openmp_pool import run_alone

T = TypeVar("T")
R = TypeVar("R")


class ReaderPool:
    """Parallel readers with per-thread scratch arrays (see the module docstring)."""

    def __init__(self, *, threads: int, scratch_bytes: int, name: str) -> None:
        self.scratch_bytes = scratch_bytes
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(
            threads, thread_name_prefix=f"prefixrag-kv-{name}-read", initializer=run_alone
        )

    def scratch(self) -> np.ndarray:
        """The calling thread's scratch array (made on first use)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = np.empty(self.scratch_bytes, dtype=np.uint8)
        return scratch

    def run_all(self, fn: Callable[[T, np.ndarray], R], items: Sequence[T]) -> list[R]:
        """``fn(item, scratch)`` for every item, in parallel; the results in order, once all are done.
        ``fn`` must not raise (a failed read is a result, e.g. 0)."""
        if len(items) == 1:  # no hand-off for one block
            return [fn(items[0], self.scratch())]
        futures = [self._pool.submit(self._call, fn, item) for item in items]
        return [f.result() for f in futures]

    def _call(self, fn: Callable[[T, np.ndarray], R], item: T) -> R:
        return fn(item, self.scratch())

    def close(self) -> None:
        self._pool.shutdown(wait=False)
