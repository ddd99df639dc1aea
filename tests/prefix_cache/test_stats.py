"""CacheStats: counter values, token-weighted hit rate, byte gauges, per-namespace views, monotonicity."""

from __future__ import annotations

import dataclasses
import random

import pytest

from prefix_cache import CacheStats, RadixCache
from prefix_cache.stats import COUNTER_FIELDS
from tests.prefix_cache.cache_helpers import prefix_values

BIG = 1 << 30


def test_counters_after_a_scripted_sequence() -> None:
    cache = RadixCache(BIG)
    cache.insert([1, 2, 3, 4], prefix_values([1, 2, 3, 4]))
    cache.insert([1, 2, 5], prefix_values([1, 2, 5]))  # splits [1, 2, 3, 4]
    cache.match_prefix([1, 2, 3, 9])  # hits 3, splits [3, 4]
    cache.match_prefix([8, 8])  # hits 0
    cache.evict(1)
    s = cache.stats()
    expected = {
        "query_tokens": 6,
        "hit_tokens": 3,
        "matches": 2,
        "inserts": 2,
        "inserted_tokens": 5,
        "insert_dropped_tokens": 0,
        "evictions": 1,
        "evicted_bytes": 8,
        "evicted_tokens": 1,
        "splits": 2,
        "nodes": 3,
        "cached_tokens": 4,
        "used_bytes": 32,
        "evictable_bytes": 32,
        "protected_bytes": 0,
        "capacity_bytes": BIG,
    }
    assert {k: getattr(s, k) for k in expected} == expected
    assert s.hit_rate == 0.5


def test_hit_rate_is_token_weighted() -> None:
    cache = RadixCache(BIG)
    short = list(range(10))
    cache.insert(short, prefix_values(short))
    cache.match_prefix(short)  # 10 of 10
    cache.match_prefix(list(range(100, 190)))  # 0 of 90
    assert cache.stats().hit_rate == pytest.approx(10 / 100)  # not the per-request mean 0.5
    assert RadixCache(BIG).stats().hit_rate == 0.0


def test_byte_gauges_follow_locks() -> None:
    cache = RadixCache(BIG)
    cache.insert([1, 2, 3, 4], prefix_values([1, 2, 3, 4]))
    cache.insert([1, 2, 7], prefix_values([1, 2, 7]))
    m = cache.match_prefix([1, 2, 3, 4], lock=True)
    s = cache.stats()
    assert (s.used_bytes, s.protected_bytes, s.evictable_bytes) == (40, 32, 8)
    cache.unlock(m.node)
    s = cache.stats()
    assert (s.used_bytes, s.protected_bytes, s.evictable_bytes) == (40, 0, 40)


def test_per_namespace_stats_sum_to_the_total() -> None:
    cache = RadixCache(BIG)
    for ns, seq in [("a", [1, 2, 3]), ("b", [1, 2]), ("a", [1, 9])]:
        cache.insert(seq, prefix_values(seq), ns)
        cache.match_prefix([*seq, 0], ns)
    total = cache.stats()
    parts = [cache.stats("a"), cache.stats("b")]
    for field in (*COUNTER_FIELDS, "used_bytes", "nodes", "cached_tokens"):
        assert getattr(total, field) == sum(getattr(p, field) for p in parts), field
    assert cache.stats("a").cached_tokens == 4 and cache.stats("b").used_bytes == 16
    assert cache.stats("nobody") == dataclasses.replace(cache.stats("nobody"), query_tokens=0, used_bytes=0)


def test_counters_are_monotonic_under_random_operations_and_reset() -> None:
    rng = random.Random(7)
    cache = RadixCache(capacity_bytes=300 * 8)
    held = []
    previous = cache.stats()
    for step in range(1500):
        seq = [rng.randrange(4)] + [rng.randrange(20) for _ in range(rng.randrange(1, 60))]
        op = rng.random()
        if op < 0.45:
            cache.insert(seq, prefix_values(seq), rng.choice(["", "t"]))
        elif op < 0.8:
            lock = rng.random() < 0.3
            m = cache.match_prefix(seq, rng.choice(["", "t"]), lock=lock)
            if lock:
                held.append(m.node)
        elif op < 0.9 and held:
            cache.unlock(held.pop(rng.randrange(len(held))))
        elif op < 0.99:
            cache.evict(rng.randrange(1000))
        else:
            cache.reset()
            held.clear()
        current = cache.stats()
        for field in COUNTER_FIELDS:
            assert getattr(current, field) >= getattr(previous, field), (step, field)
        assert (
            current.used_bytes == current.evictable_bytes + current.protected_bytes <= current.capacity_bytes
        )
        previous = current
    cache.check_invariants()


def test_stats_is_a_frozen_snapshot_with_a_dict_view() -> None:
    cache = RadixCache(BIG)
    s = cache.stats()
    cache.insert([1], prefix_values([1]))
    assert s.inserts == 0 and cache.stats().inserts == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.inserts = 5  # type: ignore[misc]
    d = cache.stats().to_dict()
    assert d["hit_rate"] == 0.0 and d["used_bytes"] == 8
    assert set(d) == {f.name for f in dataclasses.fields(CacheStats)}
