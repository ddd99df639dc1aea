"""WriteBehind: a bounded queue of prefixes and one low-priority thread that writes them.

The request path only enqueues (``submit`` never blocks: a full queue drops the prefix, which the next
insert of it queues again); the thread calls ``write(namespace, tokens)`` for each, outlives any one
failure, and runs ``idle()`` every ``idle_s`` while there is nothing to write (a store refreshing what
its stats show). The thread runs at the lowest CPU priority, so it yields the cores to the model, and its
parallel regions alone (``engine.openmp_pool.run_alone``), so it never throttles the engine's team.

Example:
    >>> behind = WriteBehind(lambda ns, tokens: print(ns, len(tokens)), name="disk")
    >>> behind.submit("tenant", [1, 2, 3]) and behind.flush(5)
    tenant 3
    True
    >>> behind.close()
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from engine.openmp_pool import run_alone

log = logging.getLogger(__name__)

_WRITER_NICE = 19  # the writer (and the writeback its fsync does) yields the CPU to the model's threads
_STOP = None


class WriteBehind:
    """A writer thread behind a bounded queue (see the module docstring)."""

    def __init__(
        self,
        write: Callable[[str, list[int]], None],
        *,
        name: str,
        queue_size: int = 256,
        idle: Callable[[], None] | None = None,
        idle_s: float = 5.0,
    ) -> None:
        self._write = write
        self._idle = idle
        self._idle_s = idle_s
        self._queue: queue.Queue[tuple[str, list[int]] | None] = queue.Queue(maxsize=queue_size)
        self._closed = False
        self.thread = threading.Thread(target=self._loop, name=f"prefixrag-kv-{name}-writer", daemon=True)
        self.thread.start()

    def submit(self, namespace: str, tokens: list[int]) -> bool:
        """Queue one prefix; False if it was dropped (the queue is full, or the writer is closed)."""
        if self._closed:
            return False
        try:
            self._queue.put_nowait((namespace, tokens))
        except queue.Full:
            return False
        return True

    @property
    def depth(self) -> int:
        """Prefixes waiting or being written."""
        return self._queue.unfinished_tasks

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued prefix is written; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the thread."""
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout_s)
        self.thread.join(timeout_s)

    def _loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
        run_alone()  # a team of the writer's own would throttle the engine's while it writes
        while True:
            try:
                item = self._queue.get(timeout=self._idle_s if self._idle else None)
            except queue.Empty:
                self._run_idle()
                continue
            try:
                if item is _STOP:
                    return
                self._write(*item)
            except Exception:  # the writer outlives any one prefix
                log.exception("%s: writing a prefix failed", self.thread.name)
            finally:
                self._queue.task_done()

    def _run_idle(self) -> None:
        assert self._idle is not None
        try:
            self._idle()
        except Exception:
            log.exception("%s: idle work failed", self.thread.name)
