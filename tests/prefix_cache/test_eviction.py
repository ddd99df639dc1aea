"""Eviction: LRU order, leaf-first cascade, locks, GDSF cost/frequency/aging, the lazy heap."""

from __future__ import annotations

import pytest

from prefix_cache import GDSFPolicy, LRUPolicy, RadixCache, TreeNode, make_policy, recompute_cost
from tests.prefix_cache.cache_helpers import nodes, prefix_values

BIG = 1 << 30


def insert_all(cache: RadixCache, *seqs: list[int]) -> None:
    for s in seqs:
        cache.insert(s, prefix_values(s))


A, B, C = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]


@pytest.mark.parametrize(
    ("touch", "order"),
    [
        ([], [A, B, C]),  # insertion order
        ([A], [B, C, A]),
        ([B, A], [C, B, A]),
        ([C, B, A], [C, B, A]),
        ([A, A, C], [B, A, C]),
    ],
)
def test_lru_evicts_least_recently_used_leaf_first(touch: list[list[int]], order: list[list[int]]) -> None:
    cache = RadixCache(BIG)
    insert_all(cache, A, B, C)
    for seq in touch:
        cache.match_prefix(seq)
    evicted = []
    for _ in range(3):
        assert cache.evict(1) == 32  # whole nodes: asking for 1 byte frees a 4-token leaf
        evicted.append(next(s for s in (A, B, C) if s not in evicted and cache.peek_length(s) == 0))
    assert evicted == order
    assert cache.evict(1) == 0


def test_evicting_a_leaf_can_make_its_parent_a_leaf() -> None:
    cache = RadixCache(BIG)
    insert_all(cache, [1, 2, 3, 4], [1, 2, 5, 6])  # [1, 2] -> {[3, 4], [5, 6]}
    assert cache.stats().nodes == 3
    assert cache.evict(16) == 16 and cache.stats().nodes == 2  # one child first, never the parent
    assert cache.evict(16) == 16 and cache.stats().nodes == 1
    assert cache.peek_length([1, 2, 9]) == 2
    assert cache.evict(16) == 16 and cache.stats().nodes == 0
    cache.check_invariants()


def test_evict_frees_at_least_what_is_asked_when_possible() -> None:
    cache = RadixCache(BIG)
    insert_all(cache, A, B, C)
    assert cache.evict(0) == 0
    assert cache.evict(33) == 64  # two whole leaves
    assert cache.evict(BIG) == 32 and cache.used_bytes == 0
    stats = cache.stats()
    assert (stats.evictions, stats.evicted_bytes, stats.evicted_tokens) == (3, 96, 12)


def test_locked_path_is_never_evicted_but_unlocked_branches_are() -> None:
    cache = RadixCache(BIG)
    insert_all(cache, [1, 2, 3, 4], [1, 2, 5, 6], [9, 9])
    m = cache.match_prefix([1, 2, 3, 4], lock=True)
    assert cache.evict(BIG) == 4 * 8
    assert cache.peek_length([1, 2, 3, 4]) == 4
    cache.unlock(m.node)
    assert cache.evict(BIG) == 4 * 8


@pytest.mark.parametrize(("policy", "survivor"), [("lru", B), ("gdsf", A)])
def test_gdsf_keeps_frequently_hit_prefixes_that_lru_would_drop(policy: str, survivor: list[int]) -> None:
    cache = RadixCache(BIG, policy=policy)
    insert_all(cache, A)
    for _ in range(3):
        cache.match_prefix(A)  # A is popular...
    insert_all(cache, B)  # ...but B is more recent
    cache.evict(1)
    assert [s for s in (A, B) if cache.peek_length(s) == 4] == [survivor]


@pytest.mark.parametrize(("policy", "survivor"), [("lru", "shallow"), ("gdsf", "deep")])
def test_gdsf_prefers_to_keep_tokens_that_are_dearer_to_recompute(policy: str, survivor: str) -> None:
    chosen = GDSFPolicy(attention_window=16) if policy == "gdsf" else LRUPolicy()
    cache = RadixCache(BIG, policy=chosen)
    deep = [*range(100, 136), 1, 2, 3, 4]
    insert_all(cache, deep)
    cache.match_prefix(deep[:36])  # splits: the leaf [1, 2, 3, 4] now sits at depth 36, untouched
    lock = cache.match_prefix(deep[:36], lock=True)  # keep the shared head out of the contest
    insert_all(cache, [7, 7, 7, 7])  # same size and hits, more recent, at depth 0
    cache.evict(1)
    alive = {"deep": cache.peek_length(deep) == 40, "shallow": cache.peek_length([7, 7, 7, 7]) == 4}
    assert [k for k, v in alive.items() if v] == [survivor]
    cache.unlock(lock.node)


def test_gdsf_clock_ages_out_formerly_popular_prefixes() -> None:
    cache = RadixCache(capacity_bytes=8 * 8, policy="gdsf")
    insert_all(cache, A)
    for _ in range(3):
        cache.match_prefix(A)  # priority 4 hits x cost / bytes
    rounds = 0
    while cache.peek_length(A) == 4:
        rounds += 1
        assert rounds < 50, "without aging A would stay forever"
        fresh = [100 + rounds] * 4
        cache.insert(fresh, prefix_values(fresh))  # each insert evicts one 4-token leaf
    assert rounds > 2  # A outlived several one-hit newcomers first


def test_gdsf_priority_formula() -> None:
    policy = GDSFPolicy(attention_window=100)
    cache = RadixCache(BIG, policy=policy)
    insert_all(cache, list(range(50)))
    node = cache.match_prefix([*range(20), -1]).node.children[20]  # tokens [20, 50)
    node.hit_count, node.clock = 3, 2.5
    expected = 2.5 + 3 * recompute_cost(20, 30, 100) / (30 * 8)
    assert policy.priority(node) == pytest.approx(expected)
    assert LRUPolicy().priority(node) == node.last_access_time


@pytest.mark.parametrize(
    ("start", "length", "window"), [(0, 1, 10), (0, 50, 10), (37, 13, 3072), (500, 1, 7)]
)
def test_recompute_cost_is_the_per_token_sum(start: int, length: int, window: float) -> None:
    brute = sum(1 + p / window for p in range(start, start + length))
    assert recompute_cost(start, length, window) == pytest.approx(brute)
    assert recompute_cost(start, 0, window) == 0.0


@pytest.mark.parametrize(("name", "cls"), [("lru", LRUPolicy), ("LRU", LRUPolicy), ("gdsf", GDSFPolicy)])
def test_make_policy(name: str, cls: type) -> None:
    assert isinstance(make_policy(name), cls)


@pytest.mark.parametrize("bad", ["mru", "", None])
def test_make_policy_rejects_unknown_names(bad) -> None:
    with pytest.raises(ValueError, match="eviction policy"):
        make_policy(bad)


def test_gdsf_rejects_non_positive_window() -> None:
    with pytest.raises(ValueError, match="attention_window"):
        GDSFPolicy(attention_window=0)


class MostRecentFirst:
    """A custom strategy: any object with priority(node) works."""

    def priority(self, node: TreeNode) -> float:
        return -node.last_access_time


def test_custom_policy_object() -> None:
    cache = RadixCache(BIG, policy=MostRecentFirst())
    insert_all(cache, A, B, C)
    cache.match_prefix(A)
    cache.evict(1)
    assert cache.peek_length(A) == 0 and cache.peek_length(B) == 4


def test_lazy_heap_stays_bounded_under_lock_churn() -> None:
    cache = RadixCache(BIG)
    insert_all(cache, A, B, C, [1, 1, 9])
    for i in range(5000):
        m = cache.match_prefix((A, B, C)[i % 3], lock=True)
        cache.unlock(m.node)  # each unlock to zero pushes a heap entry
        assert len(cache._leaves) <= 2 * cache.stats().nodes + 1025
    cache.check_invariants()
    assert cache.evict(BIG) == cache.stats().evicted_bytes == 13 * 8  # [1, 1, 9] shares [1, 1] with A


def test_insert_eviction_spares_locked_and_evicts_in_lru_order() -> None:
    cache = RadixCache(capacity_bytes=12 * 8)
    insert_all(cache, A, B, C)
    held = cache.match_prefix(A, lock=True)
    cache.match_prefix(B)
    insert_all(cache, [4, 4, 4, 4])  # must evict: C is the LRU unlocked leaf
    assert [cache.peek_length(s) for s in (A, B, C)] == [4, 4, 0]
    insert_all(cache, [5, 5, 5, 5])  # next: B (A is locked, [4...] is newer)
    assert [cache.peek_length(s) for s in (A, B, C)] == [4, 0, 0]
    cache.unlock(held.node)
    assert len(list(nodes(cache))) == 3
