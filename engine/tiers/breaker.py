"""CircuitBreaker: after a failed call to a store, skip it for a cooldown (doubling while it keeps
failing, up to a cap), then let one background call through to probe it; a success closes the
breaker again.

Only background work (the writer thread) may probe: so a dead or stalled store costs the request
that found it one bounded timeout, then nothing per request until a probe finds it back. The outage
is logged once when it starts and once when it ends.

Example:
    >>> breaker = CircuitBreaker("redis://cache:6379/0", logging.getLogger("doc"))
    >>> breaker.allow()
    True
    >>> breaker.failed(TimeoutError("timed out")); breaker.allow(), breaker.allow(probe=True)
    (False, False)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """Closed (calls go through), open (calls are skipped), or probing (one call is out)."""

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        *,
        cooldown_s: float = 1.0,
        max_cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.log = log
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.clock = clock
        self.opens = 0  # outages so far
        self._lock = threading.Lock()
        self._cooldown_s = cooldown_s
        self._open_until: float | None = None  # None: closed
        self._down_since = 0.0
        self._probing = False

    @property
    def available(self) -> bool:
        """Whether calls go through now (closed)."""
        return self._open_until is None

    def allow(self, *, probe: bool = False) -> bool:
        """Whether a call may go now: always while closed; while open, only a ``probe`` (one at a time)
        once the cooldown is over."""
        with self._lock:
            if self._open_until is None:
                return True
            if not probe or self._probing or self.clock() < self._open_until:
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        with self._lock:
            was_open = self._open_until is not None
            self._open_until, self._probing, self._cooldown_s = None, False, self.base_cooldown_s
            down_s = self.clock() - self._down_since
        if was_open:
            self.log.warning("%s answers again after %.1f s: the remote KV tier is back", self.name, down_s)

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self._open_until is None
            if first:
                self.opens += 1
                self._down_since = self.clock()
                self._cooldown_s = self.base_cooldown_s
            elif self._probing:
                self._cooldown_s = min(2 * self._cooldown_s, self.max_cooldown_s)
            self._probing = False
            self._open_until = self.clock() + self._cooldown_s
            cooldown = self._cooldown_s
        if first:
            self.log.warning(
                "%s unreachable (%s): remote KV lookups are misses, writes are dropped; retrying every "
                "%.0f-%.0f s",
                self.name,
                exc,
                cooldown,
                self.max_cooldown_s,
            )
