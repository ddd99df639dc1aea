"""Random insert / match / peek / lock / unlock / pin / unpin / evict sequences against a brute-force model.

The model is the set of cached whole-page token prefixes per namespace (prefix-closed). Every step checks the
cache against it: match and insert lengths exactly, values (each token's value is a hash of its prefix,
so any correct cache returns the same rows), byte totals, capacity, and that eviction only ever removes
unprotected prefixes, only when it must, and reports the bytes it freed.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefix_cache import RadixCache
from tests.prefix_cache.cache_helpers import BYTES_PER_TOKEN, contents, joined, prefix_values

NAMESPACES = ["", "x"]
BASES = [[0, 1, 2, 3] * 3, [0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2], [1] * 12]
# Random sequences, and prefixes of a few shared bases plus a short tail: many mid-node matches.
seqs = st.one_of(
    st.lists(st.integers(0, 3), max_size=14),
    st.builds(
        lambda base, k, tail: base[:k] + tail,
        st.sampled_from(BASES),
        st.integers(0, 12),
        st.lists(st.integers(0, 3), max_size=3),
    ),
)
namespaces = st.sampled_from(NAMESPACES)
Prefix = tuple[int, ...]


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        capacity_tokens=st.one_of(st.integers(0, 40), st.just(10_000)),
        page_size=st.sampled_from([1, 1, 2, 3]),
        policy=st.sampled_from(["lru", "gdsf"]),
    )
    def setup(self, capacity_tokens: int, page_size: int, policy: str) -> None:
        self.cache = RadixCache(capacity_tokens * BYTES_PER_TOKEN, page_size, policy=policy)
        self.page = page_size
        self.model: dict[str, set[Prefix]] = {ns: set() for ns in NAMESPACES}
        self.locks: list[tuple[str, object, Prefix]] = []  # (namespace, handle, prefix it protects)
        self.pins: list[tuple[str, Prefix, Prefix]] = []  # (namespace, pinned tokens, prefix protected)

    # ---- model helpers ----------------------------------------------------------------------------

    def longest(self, ns: str, seq: list[int], cap: int | None = None) -> int:
        n = len(seq) if cap is None else min(len(seq), cap)
        n -= n % self.page
        while n > 0 and tuple(seq[:n]) not in self.model[ns]:
            n -= self.page
        return n

    def protected(self, ns: str, prefix: Prefix) -> bool:
        held = [p for n, _, p in self.locks if n == ns] + [p for n, _, p in self.pins if n == ns]
        return any(prefix == p[: len(prefix)] for p in held)

    def observe(self) -> dict[str, set[Prefix]]:
        return {ns: set(contents(self.cache, ns)) for ns in NAMESPACES}

    def total_tokens(self, state: dict[str, set[Prefix]]) -> int:
        return self.page * sum(len(s) for s in state.values())

    def check_evicted(self, before: dict[str, set[Prefix]], after: dict[str, set[Prefix]]) -> int:
        evicted = 0
        for ns in NAMESPACES:
            for prefix in before[ns] - after[ns]:
                assert not self.protected(ns, prefix), f"evicted protected {prefix} in {ns!r}"
                evicted += self.page
        return evicted

    def nothing_evictable_besides(self, state: dict[str, set[Prefix]], spared: tuple[str, Prefix]) -> bool:
        for ns in NAMESPACES:
            for prefix in state[ns]:
                on_spared_path = ns == spared[0] and prefix == spared[1][: len(prefix)]
                if not self.protected(ns, prefix) and not on_spared_path:
                    return False
        return True

    # ---- rules ------------------------------------------------------------------------------------

    @rule(ns=namespaces, seq=seqs)
    def insert(self, ns: str, seq: list[int]) -> None:
        before = self.observe()
        expected_cached = self.longest(ns, seq)
        aligned = len(seq) - len(seq) % self.page
        result = self.cache.insert_detailed(seq, prefix_values(seq), ns)
        after = self.observe()

        assert result.already_cached == expected_cached
        assert result.already_cached + result.stored + result.dropped + result.unaligned == len(seq)
        assert result.unaligned == len(seq) - aligned and result.stored % self.page == 0
        end = expected_cached + result.stored
        new = {tuple(seq[:k]) for k in range(expected_cached + self.page, end + 1, self.page)}
        assert new <= after[ns] and not new & before[ns]
        for k in range(self.page, expected_cached + 1, self.page):
            assert tuple(seq[:k]) in after[ns], "insert evicted its own attach path"
        for n in NAMESPACES:
            assert after[n] - (new if n == ns else set()) <= before[n], "insert added something else"
        evicted = self.check_evicted(before, after)
        need = result.stored + result.dropped
        if self.total_tokens(before) + need <= self.cache.capacity_bytes // BYTES_PER_TOKEN:
            assert evicted == 0, "evicted although the insert fitted"
        if result.dropped:
            assert self.nothing_evictable_besides(after, (ns, tuple(seq[:end])) if end else (ns, ()))
            assert (self.total_tokens(after) + self.page) * BYTES_PER_TOKEN > self.cache.capacity_bytes
        self.model = after

    @rule(ns=namespaces, seq=seqs, cap=st.one_of(st.none(), st.integers(0, 14)), lock=st.booleans())
    def match(self, ns: str, seq: list[int], cap: int | None, lock: bool) -> None:
        expected = self.longest(ns, seq, cap)
        stats = self.cache.stats(ns)
        m = self.cache.match_prefix(seq, ns, max_length=cap, lock=lock)
        assert m.length == expected == m.node.end
        np.testing.assert_array_equal(joined(m.values), prefix_values(seq[:expected]))
        assert self.cache.stats(ns).hit_tokens - stats.hit_tokens == expected
        if lock:
            self.locks.append((ns, m.node, tuple(seq[:expected])))
        assert self.observe() == self.model  # splits never change what is cached

    @rule(ns=namespaces, seq=seqs, cap=st.one_of(st.none(), st.integers(0, 14)))
    def peek(self, ns: str, seq: list[int], cap: int | None) -> None:
        stats = self.cache.stats()
        assert self.cache.peek_length(seq, ns, max_length=cap) == self.longest(ns, seq, cap)
        assert self.cache.stats() == stats

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.locks) - 1))
        _, node, _ = self.locks.pop(i)
        self.cache.unlock(node)  # type: ignore[arg-type]

    @rule(ns=namespaces, seq=seqs)
    def pin(self, ns: str, seq: list[int]) -> None:
        expected = self.longest(ns, seq)
        assert self.cache.pin(seq, ns) == expected
        self.pins.append((ns, tuple(seq), tuple(seq[:expected])))

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        ns, seq, _ = self.pins[data.draw(st.integers(0, len(self.pins) - 1))]
        latest = max(i for i, (n, s, _) in enumerate(self.pins) if (n, s) == (ns, seq))
        _, _, protected = self.pins.pop(latest)
        assert self.cache.unpin(list(seq), ns) == len(protected)

    @rule(num_tokens=st.integers(0, 50))
    def evict(self, num_tokens: int) -> None:
        before = self.observe()
        freed = self.cache.evict(num_tokens * BYTES_PER_TOKEN)
        after = self.observe()
        for ns in NAMESPACES:
            assert after[ns] <= before[ns]
        assert freed == self.check_evicted(before, after) * BYTES_PER_TOKEN
        if freed < num_tokens * BYTES_PER_TOKEN:
            assert self.nothing_evictable_besides(after, ("", ()))
        self.model = after

    # ---- invariants -------------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        assert self.observe() == self.model
        used = self.total_tokens(self.model) * BYTES_PER_TOKEN
        assert self.cache.used_bytes == used <= self.cache.capacity_bytes
        for ns, _, prefix in self.locks:
            assert prefix in self.model[ns] or not prefix
        for ns, _, prefix in self.pins:
            assert prefix in self.model[ns] or not prefix


CacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixCacheAgainstModel = CacheMachine.TestCase
