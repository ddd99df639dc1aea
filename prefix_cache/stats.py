"""CacheStats: a snapshot of the cache's counters (monotonic) and gauges (current sizes)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

# Monotonic counters: they only grow, also across reset() (Prometheus-style).
COUNTER_FIELDS = (
    "query_tokens",
    "hit_tokens",
    "matches",
    "inserts",
    "inserted_tokens",
    "insert_dropped_tokens",
    "evictions",
    "evicted_bytes",
    "evicted_tokens",
    "splits",
)
# Gauges: what the cache holds now; reset() sets them to zero.
GAUGE_FIELDS = ("used_bytes", "evictable_bytes", "protected_bytes", "nodes", "cached_tokens")


@dataclass(slots=True)
class Counters:
    """Mutable per-namespace counters the cache updates in place (internal)."""

    query_tokens: int = 0
    hit_tokens: int = 0
    matches: int = 0
    inserts: int = 0
    inserted_tokens: int = 0
    insert_dropped_tokens: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    evicted_tokens: int = 0
    splits: int = 0
    used_bytes: int = 0
    evictable_bytes: int = 0
    protected_bytes: int = 0
    nodes: int = 0
    cached_tokens: int = 0

    def clear_gauges(self) -> None:
        for name in GAUGE_FIELDS:
            setattr(self, name, 0)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What `RadixCache.stats()` returns: counters since creation plus current sizes.

    `hit_rate` is token-weighted: hit_tokens / query_tokens (0.0 before any query). A query counts the
    tokens asked for after `max_length`, so the engine's len(prompt)-1 cap does not lower the rate.
    `used_bytes == evictable_bytes + protected_bytes` (protected: locked or pinned paths).

    Example:
        >>> import numpy as np
        >>> from prefix_cache import RadixCache
        >>> cache = RadixCache(capacity_bytes=1 << 20)
        >>> _ = cache.insert([1, 2, 3, 4], np.zeros(4, dtype=np.int64))
        >>> m = cache.match_prefix([1, 2, 9, 9])
        >>> s = cache.stats()
        >>> (s.query_tokens, s.hit_tokens, s.hit_rate, s.used_bytes, s.nodes)
        (4, 2, 0.5, 32, 2)
    """

    capacity_bytes: int
    hit_rate: float
    query_tokens: int
    hit_tokens: int
    matches: int
    inserts: int
    inserted_tokens: int
    insert_dropped_tokens: int
    evictions: int
    evicted_bytes: int
    evicted_tokens: int
    splits: int
    used_bytes: int
    evictable_bytes: int
    protected_bytes: int
    nodes: int
    cached_tokens: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def snapshot(counters: Iterable[Counters], capacity_bytes: int) -> CacheStats:
    """Sum `counters` (one per namespace, or just one) into a CacheStats."""
    total = Counters()
    for c in counters:
        for f in fields(Counters):
            setattr(total, f.name, getattr(total, f.name) + getattr(c, f.name))
    hit_rate = total.hit_tokens / total.query_tokens if total.query_tokens else 0.0
    return CacheStats(capacity_bytes=capacity_bytes, hit_rate=hit_rate, **asdict(total))
