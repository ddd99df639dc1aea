"""The remote tier: KV blocks in a Redis server that the engines of one model on every host share; a
`BlockTier` (engine.tiers.block_tier) over `RedisStore`.

A record is one Redis string: the same bytes as a disk-tier file (engine.tiers.blockformat), under
``prefixrag:kv:<address>``, so the same content addresses hold (model fingerprint, KV format, tenant
namespace, tokens): no other model, format or tenant can name a block, and every value is checked on
read (a damaged, truncated or foreign value is a miss, logged and deleted). Nothing is unpickled.

Redis bounds the tier itself: give it ``maxmemory`` and ``maxmemory-policy allkeys-lru`` (a cache, so
``save ""`` and ``appendonly no`` too); a block it evicts between a lookup and the read is a miss.
Every call has a socket timeout; a failed or timed-out call opens a circuit breaker
(engine.tiers.breaker), so a down, slow or restarting Redis costs one bounded wait and then nothing
per request: lookups are misses, writes are dropped (the next insert of a prefix writes it again),
and the writer thread probes it (with its writes, and every few seconds when idle) until it answers.

Example:
    >>> cfg = EngineConfig(remote_cache_url="redis://cache.internal:6379/0")   # doctest: +SKIP
    >>> engine.stats()["remote"]["hit_tokens"]                                  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from engine.tiers.block_tier import BlockTier
from engine.tiers.breaker import CircuitBreaker
from engine.tiers.store import StoreUnavailable, StoreWriteError

log = logging.getLogger(__name__)

KEY_PREFIX = "prefixrag:kv:"
_REFRESH_S = 5.0  # the figures from INFO are at most this old
T = TypeVar("T")


class RedisStore:
    """`BlockStore` over one Redis database (see the module docstring)."""

    def __init__(self, url: str, *, timeout_s: float, max_connections: int = 16) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = safe_url(url)
        self.breaker = CircuitBreaker(f"Redis at {self.url}", log, cooldown_s=0.5, max_cooldown_s=5.0)
        self._errors = (redis.ConnectionError, redis.TimeoutError)
        self._refused = redis.ResponseError
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # one immediate retry on a broken connection (a restarted server), none on a timeout
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            max_connections=max_connections,
        )
        self._figures: dict[str, int] = {"used_bytes": 0, "capacity_bytes": 0, "evictions": 0}
        self._refreshed = 0.0

    def exists(self, addresses: Sequence[str]) -> list[bool]:
        def op(client: Any) -> list[bool]:
            pipe = client.pipeline(transaction=False)
            for key in addresses:
                pipe.exists(KEY_PREFIX + key)
            return [bool(n) for n in pipe.execute()]

        return self._call(op, probe=False) if addresses else []

    def read(self, address: str, scratch: np.ndarray) -> np.ndarray | None:
        value = self._call(lambda c: c.get(KEY_PREFIX + address), probe=False)
        if value is None:
            return None
        src = np.frombuffer(value, dtype=np.uint8)
        if src.nbytes > scratch.nbytes:
            return src.copy()
        scratch[: src.nbytes] = src  # the tensors are views of writable memory
        return scratch[: src.nbytes]

    def head(self, address: str, nbytes: int) -> bytes | None:
        value = self._call(lambda c: c.getrange(KEY_PREFIX + address, 0, nbytes - 1), probe=True)
        return bytes(value) or None

    def write(
        self,
        address: str,
        parts: Sequence[bytes | memoryview],
        *,
        durable: bool,
        depth: int,
        keep: Collection[str],
    ) -> int | None:
        value = b"".join(parts)
        try:
            self._call(lambda c: c.set(KEY_PREFIX + address, value), probe=True)
        except self._refused as exc:  # e.g. OOM: maxmemory without an eviction policy
            raise StoreWriteError(str(exc)) from None
        return len(value)

    def touch(self, addresses: Sequence[tuple[str, int]]) -> list[bool]:
        def op(client: Any) -> list[bool]:
            pipe = client.pipeline(transaction=False)
            for key, _ in addresses:
                pipe.touch(KEY_PREFIX + key)
            return [bool(n) for n in pipe.execute()]

        return self._call(op, probe=True) if addresses else []

    def used(self, addresses: Sequence[tuple[str, int]]) -> None:
        """Nothing to do: reading a key refreshed its place in Redis's LRU."""

    def remove(self, address: str) -> None:
        self._call(lambda c: c.delete(KEY_PREFIX + address), probe=False)

    def describe(self, address: str) -> str:
        return f"{KEY_PREFIX}{address} at {self.url}"

    def refresh(self) -> None:
        """Read the server's memory figures (on the writer thread, while it is idle): stats() never
        waits on the network."""
        if self.breaker.available and time.monotonic() - self._refreshed < _REFRESH_S:
            return  # while it is down, every call is a probe (the breaker spaces them)
        memory = self._call(lambda c: c.info("memory"), probe=True)
        evicted = self._call(lambda c: c.info("stats"), probe=True).get("evicted_keys", 0)
        self._figures = {
            "used_bytes": int(memory.get("used_memory", 0)),
            "capacity_bytes": int(memory.get("maxmemory", 0)),
            "evictions": int(evicted),
        }
        self._refreshed = time.monotonic()

    def refresh_quietly(self) -> None:
        """``refresh``, where an unreachable server is no error (the breaker logs the outage)."""
        with contextlib.suppress(StoreUnavailable):
            self.refresh()

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.url,
            **self._figures,  # the whole server's, as of the last refresh
            "evicted_bytes": None,  # Redis does not report it
            "available": int(self.breaker.available),
            "outages": self.breaker.opens,
        }

    def close(self) -> None:
        self.client.close()

    def _call(self, op: Callable[[Any], T], *, probe: bool) -> T:
        """``op(client)``, unless the breaker is open (``probe``: a writer-thread call, which may probe
        it); a connection error or timeout opens it. Either way the caller gets StoreUnavailable."""
        if not self.breaker.allow(probe=probe):
            raise StoreUnavailable(f"{self.url} is skipped after a failure")
        try:
            out = op(self.client)
        except self._errors as exc:
            self.breaker.failed(exc)
            raise StoreUnavailable(str(exc)) from None
        self.breaker.succeeded()
        return out


def safe_url(url: str) -> str:
    """``url`` without its password (for logs and stats)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def open_remote_tier(engine: Any, fingerprint: str) -> BlockTier | None:
    """The Redis tier ``engine.config`` asks for (None when it asks for none). An unreachable server
    does not stop the engine: the tier starts skipped and reconnects by itself."""
    cfg = engine.config
    if not cfg.remote_cache_url:
        return None
    store = RedisStore(cfg.remote_cache_url, timeout_s=cfg.remote_cache_timeout_s)
    tier = BlockTier(
        store,
        name="remote",
        fingerprint=fingerprint,
        codec=engine.kv_codec,
        kv_dtype=cfg.kv_dtype,
        geometry=engine.kv_geometry,
        cache=engine.cache,
        log=log,
        idle=store.refresh_quietly,
        idle_s=1.0,
    )
    store.refresh_quietly()
    log.info("remote KV tier: %s (%s)", store.url, "up" if store.breaker.available else "not answering yet")
    return tier
