"""Several threads hammer one cache with match / lock / insert / unlock / evict / pin; invariants hold."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from prefix_cache import RadixCache
from tests.prefix_cache.cache_helpers import BYTES_PER_TOKEN, joined, prefix_values

THREADS = 6
OPS_PER_THREAD = 1500


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave threads as often as the GIL allows
    yield
    sys.setswitchinterval(old)


def make_pool(seed: int) -> list[tuple[list[int], np.ndarray]]:
    rng = random.Random(seed)
    bases = [[rng.randrange(50) for _ in range(rng.randrange(20, 120))] for _ in range(6)]
    pool = []
    for _ in range(120):
        base = rng.choice(bases)
        seq = base[: rng.randrange(len(base) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(0, 40))]
        pool.append((seq, prefix_values(seq)))
    return pool


@pytest.mark.parametrize(("page_size", "policy"), [(1, "lru"), (4, "gdsf")])
def test_concurrent_operations_keep_every_invariant(
    fast_switching: None, page_size: int, policy: str
) -> None:
    cache = RadixCache(capacity_bytes=1500 * BYTES_PER_TOKEN, page_size=page_size, policy=policy)
    pool = make_pool(0)
    system = list(range(1000, 1040))
    cache.insert(system, prefix_values(system), "tenant-0")
    errors: list[BaseException] = []
    counts = [[0, 0] for _ in range(THREADS)]  # [matches, inserts] per worker
    stop = threading.Event()

    def worker(k: int) -> None:
        rng = random.Random(k)
        ns = f"tenant-{k % 2}"
        try:
            for _ in range(OPS_PER_THREAD):
                seq, values = rng.choice(pool)
                op = rng.random()
                if op < 0.5:  # the engine's request: match+lock, "prefill", insert, unlock
                    m = cache.match_prefix(seq, ns, max_length=max(len(seq) - 1, 0), lock=True)
                    counts[k][0] += 1
                    try:
                        np.testing.assert_array_equal(joined(m.values), values[: m.length])
                        result = cache.insert_detailed(seq, values, ns)
                        counts[k][1] += 1
                        assert result.already_cached >= m.length  # our locked prefix cannot vanish
                        assert cache.peek_length(seq, ns) >= m.length
                    finally:
                        cache.unlock(m.node)
                elif op < 0.8:
                    cache.insert(seq, values, ns)
                    counts[k][1] += 1
                elif op < 0.9:
                    cache.evict(rng.randrange(2000))
                elif op < 0.95:
                    pinned = cache.pin(system, "tenant-0")
                    try:
                        cache.evict(10**9)
                        assert cache.peek_length(system, "tenant-0") >= pinned
                    finally:
                        cache.unpin(system, "tenant-0")
                else:
                    s = cache.stats()
                    assert s.used_bytes == s.evictable_bytes + s.protected_bytes <= s.capacity_bytes
        except BaseException as exc:
            errors.append(exc)

    def monitor() -> None:
        while not stop.is_set():
            if cache.used_bytes > cache.capacity_bytes:
                errors.append(AssertionError(f"over capacity: {cache.used_bytes}"))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    watcher = threading.Thread(target=monitor)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join()
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]

    cache.check_invariants()
    s = cache.stats()
    assert s.protected_bytes == 0  # every lock and pin was released
    assert s.used_bytes <= s.capacity_bytes and s.evictions > 0 and s.hit_tokens > 0
    assert s.matches == sum(c[0] for c in counts)  # no lost counter updates
    assert s.inserts == 1 + sum(c[1] for c in counts)
    for seq, values in pool:  # whatever survived is still correct
        m = cache.match_prefix(seq, "tenant-1")
        np.testing.assert_array_equal(joined(m.values), values[: m.length])
    assert cache.evict(10**9) == s.used_bytes and cache.used_bytes == 0
