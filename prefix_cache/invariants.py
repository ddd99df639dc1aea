"""check_invariants: an O(nodes) audit of a RadixCache's tree against its accounting (for tests)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from prefix_cache.keys import child_key
from prefix_cache.leaf_heap import is_evictable_leaf
from prefix_cache.node import Tree
from prefix_cache.values import value_nbytes

if TYPE_CHECKING:
    from prefix_cache.radix import RadixCache


def check_invariants(cache: RadixCache) -> None:
    """Raise AssertionError naming the first broken invariant. The caller holds the cache's lock."""
    used, nodes = 0, 0
    for tree in cache._trees.values():
        used_ns, nodes_ns = _check_tree(cache, tree)
        used += used_ns
        nodes += nodes_ns
    _require(used == cache._used, f"used_bytes {cache._used} != sum over nodes {used}")
    _require(nodes == cache._nodes, f"node count {cache._nodes} != {nodes}")
    _require(cache._used <= cache.capacity_bytes, f"used {cache._used} > capacity {cache.capacity_bytes}")
    queued = cache._leaves.lowest_priorities()  # each evictable leaf: an entry at or below its priority
    for node in cache._iter_nodes():
        if is_evictable_leaf(node):
            entry = queued.get(id(node))
            _require(entry is not None and entry <= cache.policy.priority(node), f"{node} not queued")
    pins = Counter(id(n) for stack in cache._pins.values() for n in stack if not n.is_root)
    for stack in cache._pins.values():
        for n in stack:
            _require(n.is_root or (not n.evicted and n.own_locks >= pins[id(n)]), f"pinned {n} unlocked")


def _check_tree(cache: RadixCache, tree: Tree) -> tuple[int, int]:
    c, page = tree.counters, cache.page_size
    used, nodes, tokens, protected = 0, 0, 0, 0
    for node in cache._iter_nodes(tree):
        parent = node.parent
        assert parent is not None
        _require(parent.children.get(child_key(node.key, 0, page)) is node, f"{node} misfiled")
        _require(node.tree is tree, f"{node} in the wrong namespace")
        _require(node.start == parent.end, f"{node} start {node.start} != parent end {parent.end}")
        _require(len(node.key) > 0 and len(node.key) % page == 0, f"{node} key not whole pages")
        _require(len(node.value) == len(node.key), f"{node} len(value) != len(key)")
        _require(node.nbytes == value_nbytes(node.value), f"{node} nbytes stale")
        below = sum(ch.lock_ref for ch in node.children.values())
        _require(node.lock_ref == node.own_locks + below, f"{node} lock_ref != own + children")
        used += node.nbytes
        nodes += 1
        tokens += len(node.key)
        protected += node.nbytes if node.lock_ref else 0
    _require((c.used_bytes, c.nodes, c.cached_tokens) == (used, nodes, tokens), f"{tree.name!r} gauges")
    _require(c.protected_bytes == protected, f"{tree.name!r} protected {c.protected_bytes} != {protected}")
    _require(c.evictable_bytes == used - protected, f"{tree.name!r} evictable bytes")
    return used, nodes


def _require(ok: bool, message: str) -> None:
    if not ok:  # not `assert`: the audit must also run under python -O
        raise AssertionError(message)
