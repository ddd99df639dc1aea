"""LeafHeap: a lazy min-heap of evictable leaves, ordered by an eviction policy's priority."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from prefix_cache.eviction import EvictionPolicy
from prefix_cache.node import TreeNode


def is_evictable_leaf(node: TreeNode) -> bool:
    """In the tree, not a root, no children, not locked."""
    return node.parent is not None and not node.children and node.lock_ref == 0


class LeafHeap:
    """Evictable leaves, lowest priority first, without a decrease-key.

    The cache pushes a leaf whenever it becomes evictable or its priority inputs change (creation,
    access, split, unlock, last child evicted). Entries are never removed in place: `pop` skips those
    whose node is gone, has children or is locked, and re-queues those whose priority changed.

    Example:
        >>> from prefix_cache import LRUPolicy
        >>> heap = LeafHeap(LRUPolicy())
        >>> heap.pop() is None
        True
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._heap: list[tuple[float, int, int, TreeNode]] = []  # (priority, access time, seq, node)
        self._seq = itertools.count()  # tie-breaker: nodes are never compared

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, node: TreeNode, priority: float | None = None) -> None:
        if priority is None:
            priority = self.policy.priority(node)
        heapq.heappush(self._heap, (priority, node.last_access_time, next(self._seq), node))

    def pop(self) -> tuple[TreeNode, float] | None:
        """Remove and return the evictable leaf of lowest current priority, or None if there is none."""
        heap, priority_of = self._heap, self.policy.priority
        while heap:
            priority, _, _, node = heapq.heappop(heap)
            if not is_evictable_leaf(node):
                continue  # gone, no longer a leaf, or locked: a stale entry
            current = priority_of(node)
            if current != priority:
                self.push(node, current)  # changed since it was queued
                continue
            return node, priority
        return None

    def rebuild(self, nodes: Iterable[TreeNode]) -> None:
        """Replace the entries with exactly one per evictable leaf among `nodes` (drops stale ones)."""
        self._heap = [
            (self.policy.priority(n), n.last_access_time, next(self._seq), n)
            for n in nodes
            if is_evictable_leaf(n)
        ]
        heapq.heapify(self._heap)

    def lowest_priorities(self) -> dict[int, float]:
        """id(node) -> lowest queued priority (for invariant checks)."""
        out: dict[int, float] = {}
        for priority, _, _, node in self._heap:
            out[id(node)] = min(priority, out.get(id(node), priority))
        return out
