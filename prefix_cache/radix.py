"""RadixCache: a radix tree from token ids to stored values, with a byte budget, locks and eviction.

Anchored on SGLang's `mem_cache/radix_cache.py` (TreeNode with lock_ref / last_access_time, eviction
as a strategy object, `extra_key`-style namespaces), without torch: values are opaque.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prefix_cache.config import CacheConfig
from prefix_cache.eviction import EvictionPolicy, GDSFPolicy, make_policy
from prefix_cache.invariants import check_invariants
from prefix_cache.keys import as_token_list, child_key, common_prefix_len, page_floor
from prefix_cache.leaf_heap import LeafHeap, is_evictable_leaf
from prefix_cache.node import Tree, TreeNode
from prefix_cache.results import InsertResult, MatchResult
from prefix_cache.stats import CacheStats, Counters, snapshot
from prefix_cache.values import check_value, copy_value, value_nbytes

__all__ = ["RadixCache", "TreeNode"]

Tokens = Sequence[int] | Any  # list / tuple of ints, or a 1-D integer array


class RadixCache:
    """A token-level radix tree mapping prefixes to stored values (KV segments), within a byte budget.

    One tree per namespace (tenants never share a node). `insert` stores private copies of only the
    not-yet-cached part and evicts unlocked leaves (LRU by default) to stay within `capacity_bytes`.
    A match that ends inside a node splits it, so `MatchResult.node` covers the match exactly and can
    be locked. Every public method holds one re-entrant lock.

    Example:
        >>> import numpy as np
        >>> cache = RadixCache(capacity_bytes=1 << 20)
        >>> cache.insert([1, 2, 3, 4], np.arange(4) * 10)     # tokens already cached before
        0
        >>> m = cache.match_prefix([1, 2, 3, 9])
        >>> m.length, np.concatenate(m.values).tolist()
        (3, [0, 10, 20])
        >>> cache.lock(m.node)                                # keep it while the request runs
        >>> cache.evict(1 << 20)                              # frees only the unlocked tail [4]
        8
        >>> cache.unlock(m.node)
    """

    def __init__(
        self, capacity_bytes: int, page_size: int = 1, *, policy: EvictionPolicy | str = "lru"
    ) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
        self._capacity = capacity_bytes
        self._page = page_size
        self._policy: EvictionPolicy = make_policy(policy) if isinstance(policy, str) else policy
        self._mutex = threading.RLock()
        self._counters: dict[str, Counters] = {}  # per namespace; outlive reset() (monotonic)
        self._tick = 0  # logical time for last_access_time
        self._clock = 0.0  # GDSF inflation clock L: priority of the latest victim
        self._init_state()

    @classmethod
    def from_config(cls, config: CacheConfig) -> RadixCache:
        """Build a cache from a `CacheConfig`."""
        policy: EvictionPolicy | str = config.eviction
        if config.eviction == "gdsf":
            policy = GDSFPolicy(attention_window=config.attention_window)
        return cls(config.capacity_bytes, config.page_size, policy=policy)

    def _init_state(self) -> None:
        self._trees: dict[str, Tree] = {}
        self._leaves = LeafHeap(self._policy)
        self._pins: dict[tuple[str, tuple[int, ...]], list[TreeNode]] = {}
        self._used = 0
        self._nodes = 0

    # ---- properties -------------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def page_size(self) -> int:
        return self._page

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    @property
    def used_bytes(self) -> int:
        with self._mutex:
            return self._used

    @property
    def namespaces(self) -> list[str]:
        with self._mutex:
            return list(self._trees)

    # ---- match --------------------------------------------------------------------------------------

    def match_prefix(
        self,
        tokens: Tokens,
        namespace: str = "",
        *,
        max_length: int | None = None,
        lock: bool = False,
        count: bool = True,
    ) -> MatchResult:
        """Longest cached prefix of `tokens[:max_length]` (whole pages); refreshes its access time.

        With `lock=True` the returned node is locked in the same critical section (no other thread
        can evict it between match and lock); release it with `unlock(result.node)`. `count=False`
        keeps the lookup out of the hit-rate counters (a lookup that is not a prompt's own match).
        """
        toks = as_token_list(tokens)
        n = _capped(len(toks), max_length)
        with self._mutex:
            tree = self._tree(namespace)
            c = tree.counters
            path, length = self._find(tree, toks, page_floor(n, self._page))
            self._touch(path, hit=True)
            if count:
                c.matches += 1
                c.query_tokens += n
                c.hit_tokens += length
            node = path[-1] if path else tree.root
            if lock:
                self._lock(node)
            return MatchResult(length, [p.value for p in path], node)

    def peek_length(self, tokens: Tokens, namespace: str = "", *, max_length: int | None = None) -> int:
        """Length `match_prefix` would return, without side effects (no stats, split or access refresh)."""
        toks = as_token_list(tokens)
        n = _capped(len(toks), max_length)
        with self._mutex:
            tree = self._trees.get(namespace)
            if tree is None:
                return 0
            _, length, _ = self._walk(tree, toks, page_floor(n, self._page))
            return length

    def peek_values(self, tokens: Tokens, namespace: str = "") -> tuple[int, list[Any]]:
        """The cached prefix's length and the values along it, without side effects (no stats, split
        or access refresh). The last value may run past the match: slice the concatenation."""
        toks = as_token_list(tokens)
        with self._mutex:
            tree = self._trees.get(namespace)
            if tree is None:
                return 0, []
            path, length, _ = self._walk(tree, toks, page_floor(len(toks), self._page))
            return length, [node.value for node in path]

    # ---- insert -------------------------------------------------------------------------------------

    def insert(self, tokens: Tokens, value: Any, namespace: str = "") -> int:
        """Cache `value` for `tokens` (value[i] belongs to tokens[i]); returns the tokens already cached.

        Only the uncached part is stored, as a copy. Never exceeds capacity_bytes: if eviction cannot
        make room, the part that fits is stored and the rest counted in `stats().insert_dropped_tokens`
        (`insert_detailed` reports it per call).
        """
        return self.insert_detailed(tokens, value, namespace).already_cached

    def insert_detailed(self, tokens: Tokens, value: Any, namespace: str = "") -> InsertResult:
        """`insert`, reporting how many tokens were already cached, stored, dropped and unaligned."""
        toks = as_token_list(tokens)
        check_value(value, len(toks))
        n = page_floor(len(toks), self._page)
        with self._mutex:
            tree = self._tree(namespace)
            path, i, split_at = self._walk(tree, toks, n)
            if i < n and split_at:
                path[-1] = self._split(path[-1], split_at)
            self._touch(path, hit=False)
            stored = self._store(path[-1] if path else tree.root, toks, value, i, n) if i < n else 0
            c = tree.counters
            c.inserts += 1
            c.inserted_tokens += stored
            c.insert_dropped_tokens += n - i - stored
            return InsertResult(i, stored, n - i - stored, len(toks) - n)

    def _store(self, parent: TreeNode, toks: list[int], value: Any, i: int, n: int) -> int:
        """Attach a copy of value[i:n] under `parent` (which covers toks[:i]), evicting to make room."""
        need = value_nbytes(value[i:n])
        free = self._capacity - self._used
        if need > free:
            self._lock_path(parent)  # the attach point must survive the eviction it triggers
            try:
                self._evict(need - free)
            finally:
                self._unlock_path(parent)
            free = self._capacity - self._used
        take = n - i
        if need > free:
            take = self._tokens_that_fit(value, i, take, need, free)
            if take == 0:
                return 0
        data = copy_value(value[i : i + take])
        nbytes = value_nbytes(data)
        assert self._used + nbytes <= self._capacity, (nbytes, self._used, self._capacity)
        node = TreeNode(toks[i : i + take], data, nbytes, parent, i, parent.tree, self._tick)
        node.clock = self._clock
        parent.children[child_key(node.key, 0, self._page)] = node
        self._account_new(node)
        self._push(node)
        return take

    def _tokens_that_fit(self, value: Any, i: int, take: int, need: int, free: int) -> int:
        k = min(take, page_floor(free * take // need, self._page))  # per-token bytes are near uniform
        while k > 0 and value_nbytes(value[i : i + k]) > free:
            k -= self._page
        return max(k, 0)

    # ---- locks and pins ----------------------------------------------------------------------------

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (ref-counted); a root is a no-op."""
        with self._mutex:
            self._check_handle(node, "lock")
            if node.parent is None and not node.is_root:
                raise ValueError(f"lock({node!r}): the node was evicted; match again")
            if not node.tree.alive:
                raise ValueError(
                    f"lock({node!r}): the node belongs to a tree dropped by reset(); match again"
                )
            self._lock(node)

    def unlock(self, node: TreeNode) -> None:
        """Release one `lock(node)`. Unlocking a node of a tree dropped by `reset()` is a no-op."""
        with self._mutex:
            self._check_handle(node, "unlock")
            if not node.tree.alive or node.is_root:
                return
            if node.own_locks <= 0:
                raise ValueError(f"unlock({node!r}): this node is not locked")
            node.own_locks -= 1
            self._unlock_path(node)

    def pin(self, tokens: Tokens, namespace: str = "") -> int:
        """Keep the cached prefix of `tokens` resident until `unpin(tokens)`; returns its length.

        Pins are permanent locks keyed by (namespace, tokens) and stack: pin twice, unpin twice.
        """
        toks = as_token_list(tokens)
        with self._mutex:
            tree = self._tree(namespace)
            path, length = self._find(tree, toks, page_floor(len(toks), self._page))
            self._touch(path, hit=False)
            node = path[-1] if path else tree.root
            self._lock(node)
            self._pins.setdefault((namespace, tuple(toks)), []).append(node)
            return length

    def unpin(self, tokens: Tokens, namespace: str = "") -> int:
        """Release the latest `pin(tokens, namespace)`; returns the length it had pinned."""
        key = (namespace, tuple(as_token_list(tokens)))
        with self._mutex:
            stack = self._pins.get(key)
            if not stack:
                raise ValueError(
                    f"unpin: these {len(key[1])} tokens are not pinned in namespace {namespace!r}"
                )
            node = stack.pop()
            if not stack:
                del self._pins[key]
            if not node.is_root:
                node.own_locks -= 1
                self._unlock_path(node)
            return node.end

    def _check_handle(self, node: Any, verb: str) -> None:
        if not isinstance(node, TreeNode):
            raise ValueError(f"{verb}() takes a MatchResult.node, got {type(node).__name__}")
        if node.tree.owner is not self:
            raise ValueError(f"{verb}({node!r}): the node belongs to another RadixCache")

    def _lock(self, node: TreeNode) -> None:
        if not node.is_root:
            node.own_locks += 1
            self._lock_path(node)

    def _lock_path(self, node: TreeNode) -> None:
        c = node.tree.counters
        while node.parent is not None:
            if node.lock_ref == 0:  # evictable -> protected
                c.evictable_bytes -= node.nbytes
                c.protected_bytes += node.nbytes
            node.lock_ref += 1
            node = node.parent

    def _unlock_path(self, node: TreeNode) -> None:
        bottom, c = node, node.tree.counters
        while node.parent is not None:
            assert node.lock_ref > 0, node
            node.lock_ref -= 1
            if node.lock_ref == 0:  # protected -> evictable
                c.protected_bytes -= node.nbytes
                c.evictable_bytes += node.nbytes
            node = node.parent
        if is_evictable_leaf(bottom):
            self._push(bottom)

    # ---- eviction -----------------------------------------------------------------------------------

    def evict(self, num_bytes: int) -> int:
        """Evict unlocked leaves, lowest policy priority first, until `num_bytes` are freed.

        Evicting a leaf may make its parent an evictable leaf. Returns the bytes freed: whole nodes, so
        possibly more than asked, or less when everything left is locked.
        """
        if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 0:
            raise ValueError(f"num_bytes must be an int >= 0, got {num_bytes!r}")
        with self._mutex:
            return self._evict(num_bytes)

    def _evict(self, num_bytes: int) -> int:
        freed = 0
        while freed < num_bytes:
            victim = self._leaves.pop()
            if victim is None:
                break  # everything left is locked
            node, priority = victim
            freed += self._remove_leaf(node)
            self._clock = max(self._clock, priority)  # GDSF's L
        return freed

    def _remove_leaf(self, node: TreeNode) -> int:
        parent = node.parent
        assert parent is not None and not node.children and node.lock_ref == 0, node
        del parent.children[child_key(node.key, 0, self._page)]
        node.parent = None
        nbytes, ntok, c = node.nbytes, len(node.key), node.tree.counters
        node.value = None  # drop our copy
        self._used -= nbytes
        self._nodes -= 1
        c.used_bytes -= nbytes
        c.evictable_bytes -= nbytes
        c.nodes -= 1
        c.cached_tokens -= ntok
        c.evictions += 1
        c.evicted_bytes += nbytes
        c.evicted_tokens += ntok
        if is_evictable_leaf(parent):
            self._push(parent)
        return nbytes

    def _push(self, node: TreeNode) -> None:
        self._leaves.push(node)
        if len(self._leaves) > 2 * self._nodes + 1024:  # mostly stale entries: rebuild, amortised O(1)
            self._leaves.rebuild(self._iter_nodes())

    # ---- stats, reset, checks -----------------------------------------------------------------------

    def stats(self, namespace: str | None = None) -> CacheStats:
        """Counters and sizes for the whole cache, or for one namespace (zeros if never used)."""
        with self._mutex:
            if namespace is None:
                return snapshot(self._counters.values(), self._capacity)
            return snapshot([self._counters.get(namespace, Counters())], self._capacity)

    def reset(self) -> None:
        """Drop every node, lock and pin (counters keep counting). Old handles: unlock is a no-op."""
        with self._mutex:
            for tree in self._trees.values():
                tree.alive = False
            for c in self._counters.values():
                c.clear_gauges()
            self._init_state()

    def check_invariants(self) -> None:
        """Raise AssertionError if the tree and its accounting disagree (for tests; O(nodes))."""
        with self._mutex:
            check_invariants(self)

    # ---- tree walking -------------------------------------------------------------------------------

    def _tree(self, namespace: str) -> Tree:
        tree = self._trees.get(namespace)
        if tree is None:
            if not isinstance(namespace, str):
                raise ValueError(f"namespace must be a str, got {namespace!r}")
            counters = self._counters.setdefault(namespace, Counters())
            tree = self._trees[namespace] = Tree(namespace, counters, self)
        return tree

    def _walk(self, tree: Tree, toks: list[int], n: int) -> tuple[list[TreeNode], int, int]:
        """Follow toks[:n] (whole pages) down the tree: (nodes entered, tokens matched, split_at).

        split_at > 0 means the match ends inside the last node, after split_at of its tokens.
        """
        node, i, page, path = tree.root, 0, self._page, []
        while i < n:
            child = node.children.get(toks[i] if page == 1 else tuple(toks[i : i + page]))
            if child is None:
                break
            k = common_prefix_len(child.key, toks, i, n)
            k -= k % page  # whole pages only; k >= page since the first page matched
            path.append(child)
            i += k
            if k < len(child.key):
                return path, i, k
            node = child
        return path, i, 0

    def _find(self, tree: Tree, toks: list[int], n: int) -> tuple[list[TreeNode], int]:
        """`_walk`, splitting the last node so the path ends exactly at the match."""
        path, i, split_at = self._walk(tree, toks, n)
        if split_at:
            path[-1] = self._split(path[-1], split_at)
        return path, i

    def _split(self, node: TreeNode, k: int) -> TreeNode:
        """Split node's first k tokens into a new parent; `node` keeps the rest (handles stay valid).

        Both halves are copied (a view would keep the whole old buffer alive) and both keep the lock
        count, access time and hit count.
        """
        parent, tree = node.parent, node.tree
        assert parent is not None and 0 < k < len(node.key) and k % self._page == 0, (node, k)
        head_value, tail_value = copy_value(node.value[:k]), copy_value(node.value[k:])
        head = TreeNode(node.key[:k], head_value, value_nbytes(head_value), parent, node.start, tree, 0)
        head.last_access_time, head.hit_count, head.clock = node.last_access_time, node.hit_count, node.clock
        head.lock_ref = node.lock_ref
        old_nbytes = node.nbytes
        node.key, node.value, node.nbytes = node.key[k:], tail_value, value_nbytes(tail_value)
        node.start += k
        node.parent = head
        head.children[child_key(node.key, 0, self._page)] = node
        parent.children[child_key(head.key, 0, self._page)] = head
        delta, c = head.nbytes + node.nbytes - old_nbytes, tree.counters
        self._used += delta
        self._nodes += 1
        c.used_bytes += delta
        if node.lock_ref:
            c.protected_bytes += delta
        else:
            c.evictable_bytes += delta
        c.nodes += 1
        c.splits += 1
        if is_evictable_leaf(node):
            self._push(node)  # its priority may have changed with its size and depth
        if self._used > self._capacity:  # a value type whose nbytes is not additive under slicing
            self._lock_path(head)
            try:
                self._evict(self._used - self._capacity)
            finally:
                self._unlock_path(head)
        return head

    def _touch(self, path: list[TreeNode], *, hit: bool) -> None:
        self._tick += 1
        tick, clock = self._tick, self._clock
        for node in path:
            node.last_access_time = tick
            node.clock = clock
            if hit:
                node.hit_count += 1
        if path and is_evictable_leaf(path[-1]):
            self._push(path[-1])  # only the path's end can be a leaf; its priority just changed

    def _account_new(self, node: TreeNode) -> None:
        c = node.tree.counters
        self._used += node.nbytes
        self._nodes += 1
        c.used_bytes += node.nbytes
        c.evictable_bytes += node.nbytes
        c.nodes += 1
        c.cached_tokens += len(node.key)

    def _iter_nodes(self, tree: Tree | None = None) -> Iterator[TreeNode]:
        stack = [t.root for t in ([tree] if tree else self._trees.values())]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.parent is not None:
                yield node


def _capped(n: int, max_length: int | None) -> int:
    if max_length is None:
        return n
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
        raise ValueError(f"max_length must be None or an int >= 0, got {max_length!r}")
    return min(n, max_length)
