"""Request queue: longest cached prefix first (SGLang's policy), with aging so nothing starves."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.request import QueueFullError, Request


class Scheduler:
    """A bounded waiting queue whose ``pop`` picks the request with the best score.

    score = cached prefix tokens (probed at pick time, since the cache changes) + age_s * aging_rate.
    With ``aging_rate`` tokens per second, a request that has waited long enough outranks any
    cache hit; arrival order breaks ties.

    Example:
        >>> sched = Scheduler(prefix_probe=lambda req: 0, max_waiting=64, aging_rate=2000.0)
        >>> sched.add(request)                                   # doctest: +SKIP
        >>> sched.pop()                                          # doctest: +SKIP
    """

    def __init__(
        self,
        prefix_probe: Callable[[Request], int],
        *,
        max_waiting: int,
        aging_rate: float,
    ) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.prefix_probe = prefix_probe
        self.max_waiting = max_waiting
        self.aging_rate = aging_rate
        self._waiting: list[Request] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, request: Request) -> None:
        with self._lock:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(len(self._waiting))
            self._waiting.append(request)

    def pop(self) -> Request | None:
        """Remove and return the best waiting request (cancelled ones first, they cost nothing)."""
        with self._lock:
            if not self._waiting:
                return None
            for i, req in enumerate(self._waiting):
                if req.cancelled.is_set():
                    return self._waiting.pop(i)
            if len(self._waiting) == 1:
                return self._waiting.pop()
            now = time.perf_counter()
            best = max(range(len(self._waiting)), key=lambda i: self._score(self._waiting[i], now, i))
            return self._waiting.pop(best)

    def _score(self, req: Request, now: float, position: int) -> tuple[float, int]:
        return self.prefix_probe(req) + (now - req.arrival) * self.aging_rate, -position

    def drain(self) -> list[Request]:
        with self._lock:
            waiting, self._waiting = self._waiting, []
            return waiting
