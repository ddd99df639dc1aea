"""RadixCache semantics: matching, splits, pages, copies, locks, pins, namespaces, capacity, errors."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_cache import CacheConfig, InsertResult, RadixCache
from tests.prefix_cache.cache_helpers import joined, nodes, prefix_values

BIG = 1 << 30
SEQS = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 8]]


def filled(seqs=SEQS, page_size: int = 1, capacity: int = BIG, namespace: str = "") -> RadixCache:
    cache = RadixCache(capacity, page_size)
    for s in seqs:
        cache.insert(s, prefix_values(s), namespace)
    return cache


# ---- matching -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ([1, 2, 3, 4, 5], 5),
        ([1, 2, 3, 4, 6], 4),  # ends inside [4, 5]
        ([1, 2], 2),  # ends inside the shared [1, 2, 3]
        ([1, 2, 3, 9, 9], 4),
        ([1, 2, 3, 4, 5, 6, 7], 5),  # longer than anything cached
        ([7, 8, 9], 2),
        ([8], 0),
        ([], 0),
    ],
)
def test_match_length_and_values(query: list[int], expected: int) -> None:
    cache = filled()
    m = cache.match_prefix(query)
    assert m.length == expected
    np.testing.assert_array_equal(joined(m.values), prefix_values(query[:expected]))
    assert m.node.end == expected
    cache.check_invariants()


@pytest.mark.parametrize(
    ("inserts", "returns"),
    [
        ([[1, 2, 3]], [0]),
        ([[1, 2, 3], [1, 2, 3]], [0, 3]),
        ([[1, 2, 3], [1, 2, 3, 4, 5]], [0, 3]),
        ([[1, 2, 3, 4, 5], [1, 2, 3]], [0, 3]),  # fully contained: nothing stored, no split
        ([[1, 2, 3, 4], [1, 2, 9]], [0, 2]),  # splits [1, 2, 3, 4] after 2
        ([[1, 2], [3, 4], [1, 3]], [0, 0, 1]),
        ([[], [1]], [0, 0]),
    ],
)
def test_insert_returns_tokens_already_cached(inserts: list[list[int]], returns: list[int]) -> None:
    cache = RadixCache(BIG)
    assert [cache.insert(s, prefix_values(s)) for s in inserts] == returns
    cached = {tuple(s[:i]) for s in inserts for i in range(1, len(s) + 1)}
    assert cache.stats().cached_tokens == len(cached)
    cache.check_invariants()


def test_split_mid_node_gives_node_covering_exactly_the_match() -> None:
    cache = filled([[1, 2, 3, 4, 5, 6]])
    assert cache.stats().nodes == 1
    m = cache.match_prefix([1, 2, 3, 0])
    assert (m.length, m.node.key, m.node.start, m.node.end) == (3, [1, 2, 3], 0, 3)
    assert [child.key for child in m.node.children.values()] == [[4, 5, 6]]
    assert cache.stats().nodes == 2 and cache.stats().splits == 1
    full = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert [v.tolist() for v in full.values] == [
        prefix_values([1, 2, 3]).tolist(),
        prefix_values([1, 2, 3, 4, 5, 6])[3:].tolist(),
    ]
    assert cache.used_bytes == 6 * 8  # a split moves bytes, never adds any
    cache.check_invariants()


def test_split_keeps_access_time_and_hits_on_both_halves() -> None:
    cache = filled([[1, 2, 3, 4, 5, 6]])
    (node,) = nodes(cache)
    before = (node.last_access_time, node.hit_count)
    head = cache.match_prefix([1, 2, 3, 0]).node
    assert node.parent is head
    assert (node.last_access_time, node.hit_count) == before  # the tail was not accessed
    assert head.last_access_time > before[0] and head.hit_count == before[1] + 1


def test_match_refreshes_access_time_along_the_whole_path() -> None:
    cache = filled([[1, 2, 3, 4], [1, 2, 5, 6]])
    shared = cache.match_prefix([1, 2]).node
    leaf = cache.match_prefix([1, 2, 3, 4]).node
    assert leaf.parent is shared and shared.last_access_time == leaf.last_access_time
    cache.match_prefix([1, 2, 5, 6])
    assert shared.last_access_time > leaf.last_access_time


@pytest.mark.parametrize(
    ("max_length", "page_size", "expected"),
    [(None, 1, 5), (4, 1, 4), (0, 1, 0), (99, 1, 5), (3, 2, 2), (5, 2, 4), (None, 2, 4)],
)
def test_max_length_caps_the_match(max_length: int | None, page_size: int, expected: int) -> None:
    cache = filled([[1, 2, 3, 4, 5, 6]], page_size=page_size)
    query = [1, 2, 3, 4, 5]
    assert cache.peek_length(query, max_length=max_length) == expected
    m = cache.match_prefix(query, max_length=max_length)
    assert m.length == expected and m.node.end == expected
    np.testing.assert_array_equal(joined(m.values), prefix_values(query[:expected]))
    assert cache.stats().query_tokens == min(len(query), 99 if max_length is None else max_length)


def test_peek_length_has_no_side_effects() -> None:
    cache = filled()
    times = {id(n): n.last_access_time for n in nodes(cache)}
    before = cache.stats()
    for query, expected in [([1, 2, 3, 4, 6], 4), ([1, 2], 2), ([7, 8, 9], 2), ([5], 0)]:
        assert cache.peek_length(query) == expected
    assert cache.peek_length([1, 2], namespace="never-used") == 0
    assert cache.stats() == before
    assert {id(n): n.last_access_time for n in nodes(cache)} == times
    assert cache.namespaces == [""]


@pytest.mark.parametrize(
    "tokens",
    [[5, 6, 7], (5, 6, 7), np.array([5, 6, 7]), np.array([5, 6, 7], dtype=np.int32), range(5, 8)],
    ids=["list", "tuple", "int64", "int32", "range"],
)
def test_any_int_sequence_is_accepted(tokens) -> None:
    cache = filled([[5, 6, 7, 8]])
    assert cache.match_prefix(tokens).length == 3
    assert cache.insert(tokens, prefix_values(list(tokens))) == 3


# ---- pages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (list(range(12)), 8),  # 10 inserted -> 8 stored (2 whole pages of 4)
        (list(range(9)), 8),
        (list(range(8)), 8),
        (list(range(7)), 4),  # the second page is incomplete
        ([0, 1, 2, 3, 4, 99, 6, 7], 4),  # mismatch inside page 2 drops the whole page
        ([0, 1, 99, 3], 0),  # mismatch inside page 1
        ([0, 1, 2], 0),  # shorter than a page
    ],
)
def test_page_alignment(query: list[int], expected: int) -> None:
    cache = RadixCache(BIG, page_size=4)
    result = cache.insert_detailed(list(range(10)), prefix_values(range(10)))
    assert result == InsertResult(already_cached=0, stored=8, dropped=0, unaligned=2)
    m = cache.match_prefix(query)
    assert m.length == expected
    np.testing.assert_array_equal(joined(m.values), prefix_values(query[:expected]))
    for node in nodes(cache):
        assert len(node.key) % 4 == 0
    cache.check_invariants()


def test_pages_split_on_page_boundaries_and_branch_by_first_page() -> None:
    cache = RadixCache(BIG, page_size=2)
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5, 6]  # diverge inside page 2
    cache.insert(a, prefix_values(a))
    assert cache.insert(b, prefix_values(b)) == 2
    assert sorted(n.key for n in nodes(cache)) == [[1, 2], [3, 4, 5, 6], [3, 9, 5, 6]]
    assert cache.match_prefix(b).length == 6
    cache.check_invariants()


# ---- copies ---------------------------------------------------------------------------------------


def stored_values(cache: RadixCache) -> list[np.ndarray]:
    return [n.value for n in nodes(cache)]


def test_insert_stores_a_copy_not_a_view_of_the_callers_buffer() -> None:
    big = np.zeros((10_000, 16), dtype=np.float32)
    view = big[100:110]
    cache = RadixCache(BIG)
    cache.insert(list(range(10)), view)
    (stored,) = stored_values(cache)
    assert stored.base is None and stored.nbytes == view.nbytes == cache.used_bytes
    view[:] = 1.0  # the caller reuses its buffer
    assert not joined(cache.match_prefix(list(range(10))).values).any()


def test_insert_copies_only_the_uncached_part_of_a_whole_prompt_value() -> None:
    prompt = list(range(100))
    kv = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)  # the engine's buffer
    cache = RadixCache(BIG)
    cache.insert(prompt[:60], kv[:60])
    assert cache.insert(prompt, kv) == 60
    new = next(n for n in nodes(cache) if n.start == 60)
    assert new.value.base is None and new.value.nbytes == kv[60:].nbytes
    assert cache.used_bytes == kv.nbytes
    np.testing.assert_array_equal(np.concatenate(cache.match_prefix(prompt).values), kv)


def test_split_copies_both_halves() -> None:
    cache = RadixCache(BIG)
    cache.insert(list(range(10)), np.arange(10, dtype=np.int64))
    cache.match_prefix([0, 1, 2, 3, 99])
    for value in stored_values(cache):
        assert value.base is None
    assert sorted(v.nbytes for v in stored_values(cache)) == [32, 48]


class CloneOnly:
    """A torch-like value: slicing returns views, `clone()` copies, no `copy()`."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, s: slice) -> CloneOnly:
        return CloneOnly(self.data[s])

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def clone(self) -> CloneOnly:
        return CloneOnly(self.data.copy())


class WithHeader(CloneOnly):
    """A value whose nbytes carries a fixed 100-byte header, so halves weigh more than the whole."""

    def __getitem__(self, s: slice) -> WithHeader:
        return WithHeader(self.data[s])

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + 100

    def clone(self) -> WithHeader:
        return WithHeader(self.data.copy())


def test_splits_of_non_additive_values_stay_within_capacity() -> None:
    cache = RadixCache(capacity_bytes=2 * (10 * 8 + 100))
    cache.insert(list(range(10)), WithHeader(np.arange(10)))
    cache.insert(list(range(100, 110)), WithHeader(np.arange(10)))  # full now
    m = cache.match_prefix([*range(5), -1])  # the split adds a header: something must go
    assert m.length == 5 and cache.used_bytes <= cache.capacity_bytes
    assert cache.peek_length(range(10)) == 5  # the LRU leaf went: the split-off tail [5..9]
    assert cache.peek_length(range(100, 110)) == 10
    cache.check_invariants()


def test_values_with_clone_instead_of_copy() -> None:
    cache = RadixCache(BIG)
    src = CloneOnly(np.arange(6))
    cache.insert([1, 2, 3, 4, 5, 6], src)
    m = cache.match_prefix([1, 2, 3, 0])
    assert m.values[0].data.tolist() == [0, 1, 2] and m.values[0].data.base is None
    assert all(v is not src for v in stored_values(cache))


# ---- locks ----------------------------------------------------------------------------------------


def test_zero_length_match_returns_the_namespace_root_and_locking_it_is_harmless() -> None:
    cache = filled()
    m = cache.match_prefix([42])
    assert m.length == 0 and m.values == [] and m.node.is_root
    for _ in range(3):
        cache.lock(m.node)
    for _ in range(5):
        cache.unlock(m.node)
    assert cache.stats().protected_bytes == 0
    assert cache.evict(BIG) == cache.stats().evicted_bytes > 0


def test_lock_protects_the_path_and_unlock_to_zero_makes_it_evictable() -> None:
    cache = filled([[1, 2, 3, 4]])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.lock(m.node)
    cache.lock(m.node)
    assert cache.evict(BIG) == 0
    cache.unlock(m.node)
    assert cache.evict(BIG) == 0  # one lock still held
    assert cache.stats().protected_bytes == 32
    cache.unlock(m.node)
    assert cache.stats().evictable_bytes == 32
    assert cache.evict(BIG) == 32 and cache.used_bytes == 0


def test_lock_survives_a_split() -> None:
    cache = filled([[1, 2, 3, 4, 5, 6]])
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.lock(m.node)
    head = cache.match_prefix([1, 2, 0]).node  # splits the locked node
    assert head.lock_ref == m.node.lock_ref == 1 and m.node.parent is head
    assert cache.evict(BIG) == 0 and cache.peek_length([1, 2, 3, 4, 5, 6]) == 6
    cache.unlock(m.node)
    assert head.lock_ref == 0 and m.node.lock_ref == 0
    assert cache.evict(BIG) == 48
    cache.check_invariants()


def test_locked_leaf_shields_ancestors_but_not_siblings() -> None:
    cache = filled([[1, 2, 3], [1, 2, 4], [5, 6]])
    m = cache.match_prefix([1, 2, 3])
    cache.lock(m.node)
    freed = cache.evict(BIG)
    assert freed == 3 * 8  # [4] and [5, 6]
    assert sorted(n.key for n in nodes(cache)) == [[1, 2], [3]]
    cache.unlock(m.node)


def test_match_with_lock_true_locks_atomically() -> None:
    cache = filled([[1, 2, 3]])
    m = cache.match_prefix([1, 2, 3, 4], lock=True)
    assert m.node.lock_ref == 1 and cache.evict(BIG) == 0
    cache.unlock(m.node)
    assert cache.evict(BIG) == 24


@pytest.mark.parametrize("case", ["never-locked", "only-descendant-locked", "evicted", "unlocked-twice"])
def test_unlock_errors(case: str) -> None:
    cache = filled([[1, 2, 3, 4]])
    leaf = cache.match_prefix([1, 2, 3, 4]).node
    target = leaf
    if case == "only-descendant-locked":
        cache.lock(leaf)
        target = cache.match_prefix([1, 2]).node
    elif case == "evicted":
        cache.evict(BIG)
    elif case == "unlocked-twice":
        cache.lock(leaf)
        cache.unlock(leaf)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(target)


def test_lock_errors_and_reset_semantics() -> None:
    cache = filled([[1, 2, 3]])
    other = filled([[1, 2, 3]])
    node = cache.match_prefix([1, 2, 3]).node
    with pytest.raises(ValueError, match="another RadixCache"):
        other.lock(node)
    with pytest.raises(ValueError, match=r"MatchResult\.node"):
        cache.lock("node")  # type: ignore[arg-type]
    cache.lock(node)
    cache.reset()
    cache.unlock(node)  # a request's `finally: unlock` survives a reset
    with pytest.raises(ValueError, match="reset"):
        cache.lock(node)
    cache2 = filled([[1, 2, 3]])
    gone = cache2.match_prefix([1, 2, 3]).node
    cache2.evict(BIG)
    with pytest.raises(ValueError, match="evicted"):
        cache2.lock(gone)


# ---- pins -----------------------------------------------------------------------------------------


def test_pinned_prefix_survives_eviction_pressure_until_unpinned() -> None:
    system = list(range(1000, 1050))
    cache = RadixCache(capacity_bytes=200 * 8)
    cache.insert(system, prefix_values(system))
    assert cache.pin(system) == 50
    rng = np.random.default_rng(1)
    for _ in range(200):
        seq = system + rng.integers(0, 500, size=int(rng.integers(1, 120))).tolist()
        cache.insert(seq, prefix_values(seq))
        assert cache.used_bytes <= cache.capacity_bytes
        assert cache.peek_length(system) == 50
    assert cache.stats().evictions > 0
    assert cache.unpin(system) == 50
    cache.evict(BIG)
    assert cache.peek_length(system) == 0
    cache.check_invariants()


def test_pins_stack_and_unpin_of_unpinned_raises() -> None:
    cache = filled([[1, 2, 3]])
    assert cache.pin([1, 2, 3]) == 3 and cache.pin([1, 2, 3]) == 3
    assert cache.pin([9, 9]) == 0  # nothing cached: pins the root (no-op), still pairs with unpin
    cache.unpin([1, 2, 3])
    assert cache.evict(BIG) == 0
    cache.unpin([1, 2, 3])
    cache.unpin([9, 9])
    with pytest.raises(ValueError, match="not pinned"):
        cache.unpin([1, 2, 3])
    assert cache.evict(BIG) == 24


# ---- namespaces -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("insert_ns", "query_ns", "expected"),
    [("a", "a", 3), ("a", "b", 0), ("a", "", 0), ("", "a", 0), ("", "", 3), ("a", "A", 0)],
)
def test_namespace_isolation(insert_ns: str, query_ns: str, expected: int) -> None:
    cache = filled([[1, 2, 3]], namespace=insert_ns)
    assert cache.peek_length([1, 2, 3], query_ns) == expected
    assert cache.match_prefix([1, 2, 3], query_ns).length == expected
    assert cache.stats(query_ns).hit_tokens == expected


def test_namespaces_never_share_a_node_or_a_byte() -> None:
    cache = RadixCache(BIG)
    seq = [1, 2, 3, 4]
    assert cache.insert(seq, prefix_values(seq), "a") == 0
    assert cache.insert(seq, prefix_values(seq), "b") == 0  # tenant a's prefix does not help b
    a, b = cache.match_prefix(seq, "a"), cache.match_prefix(seq, "b")
    assert a.node is not b.node and a.node.tree is not b.node.tree
    assert not np.shares_memory(a.values[0], b.values[0])
    assert cache.used_bytes == 64 and cache.stats("a").used_bytes == 32
    cache.lock(a.node)
    assert cache.evict(BIG) == 32 and cache.peek_length(seq, "b") == 0 and cache.peek_length(seq, "a") == 4


# ---- capacity -------------------------------------------------------------------------------------


def test_insert_evicts_lru_leaves_to_make_room() -> None:
    cache = RadixCache(capacity_bytes=10 * 8)
    for seq in ([1, 2, 3, 4], [5, 6, 7, 8]):
        cache.insert(seq, prefix_values(seq))
    cache.match_prefix([1, 2, 3, 4])  # [5..8] is now least recently used
    result = cache.insert_detailed([9, 9, 9, 9], prefix_values([9, 9, 9, 9]))
    assert result == InsertResult(0, 4, 0, 0)
    assert cache.peek_length([1, 2, 3, 4]) == 4 and cache.peek_length([5, 6, 7, 8]) == 0
    assert cache.used_bytes == 64 <= cache.capacity_bytes


def test_insert_stores_only_what_fits_when_everything_is_locked() -> None:
    cache = RadixCache(capacity_bytes=10 * 8)
    cache.insert([1, 2, 3, 4, 5, 6], prefix_values([1, 2, 3, 4, 5, 6]))
    held = cache.match_prefix([1, 2, 3, 4, 5, 6], lock=True)
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    result = cache.insert_detailed(seq, prefix_values(seq))
    assert result == InsertResult(already_cached=6, stored=4, dropped=3, unaligned=0)
    assert cache.used_bytes == cache.capacity_bytes
    assert cache.stats().insert_dropped_tokens == 3
    assert cache.match_prefix(seq).length == 10
    cache.unlock(held.node)
    cache.check_invariants()


def test_insert_never_evicts_its_own_attach_point() -> None:
    cache = RadixCache(capacity_bytes=6 * 8)
    cache.insert([1, 2, 3, 4], prefix_values([1, 2, 3, 4]))  # an unlocked leaf
    result = cache.insert_detailed([1, 2, 3, 4, 5, 6, 7], prefix_values([1, 2, 3, 4, 5, 6, 7]))
    assert result == InsertResult(already_cached=4, stored=2, dropped=1, unaligned=0)
    assert cache.peek_length([1, 2, 3, 4, 5, 6, 7]) == 6
    cache.check_invariants()


@pytest.mark.parametrize(
    ("capacity", "page_size", "stored"),
    [(0, 1, 0), (7, 1, 0), (8, 1, 1), (39, 1, 4), (40, 1, 5), (39, 2, 4), (47, 4, 4), (80, 4, 8)],
)
def test_partial_store_is_page_aligned_and_within_capacity(
    capacity: int, page_size: int, stored: int
) -> None:
    cache = RadixCache(capacity, page_size)
    result = cache.insert_detailed(list(range(10)), prefix_values(range(10)))
    assert result.stored == stored and cache.used_bytes == 8 * stored <= capacity
    assert result.already_cached + result.stored + result.dropped + result.unaligned == 10


# ---- construction and validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity_bytes": -1}, "capacity_bytes"),
        ({"capacity_bytes": 1.5}, "capacity_bytes"),
        ({"capacity_bytes": 10, "page_size": 0}, "page_size"),
        ({"capacity_bytes": 10, "page_size": True}, "page_size"),
        ({"capacity_bytes": 10, "policy": "fifo"}, "eviction policy"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RadixCache(**kwargs)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.insert([1, 2, 3], np.zeros(2)), r"len\(value\)=2, len\(tokens\)=3"),
        (lambda c: c.insert([1, 2], [0.0, 1.0]), "nbytes"),
        (lambda c: c.insert([1, 2], 5), "sliceable"),
        (lambda c: c.insert("ab", np.zeros(2)), "sequence of int"),
        (lambda c: c.match_prefix(7), "sequence of int"),
        (lambda c: c.match_prefix(np.zeros((2, 2), dtype=int)), "1-D"),
        (lambda c: c.match_prefix([1], max_length=-1), "max_length"),
        (lambda c: c.match_prefix([1], namespace=3), "namespace"),
        (lambda c: c.evict(-5), "num_bytes"),
    ],
)
def test_public_boundaries_raise_value_error(call, message: str) -> None:
    cache = RadixCache(BIG)
    with pytest.raises(ValueError, match=message):
        call(cache)
    cache.check_invariants()


def test_from_config() -> None:
    cache = RadixCache.from_config(CacheConfig(capacity_bytes=4096, page_size=16, eviction="gdsf"))
    assert (cache.capacity_bytes, cache.page_size, type(cache.policy).__name__) == (4096, 16, "GDSFPolicy")


def test_reset_drops_everything_but_keeps_counters() -> None:
    cache = filled()
    cache.match_prefix([1, 2, 3])
    cache.pin([7, 8])
    before = cache.stats()
    cache.reset()
    after = cache.stats()
    assert (after.used_bytes, after.nodes, after.cached_tokens, after.protected_bytes) == (0, 0, 0, 0)
    assert (after.inserts, after.hit_tokens) == (before.inserts, before.hit_tokens)
    assert cache.match_prefix([1, 2, 3]).length == 0
    with pytest.raises(ValueError, match="not pinned"):
        cache.unpin([7, 8])
    cache.check_invariants()
