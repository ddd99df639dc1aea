"""TreeNode and Tree: the radix tree's nodes and one tree (root) per namespace."""

from __future__ import annotations

from typing import Any

from prefix_cache.stats import Counters


class Tree:
    """One namespace's radix tree: its root, its counters, and whether it is still in use.

    Trees are internal; `RadixCache` keeps one per namespace and replaces them all on `reset()`.
    """

    __slots__ = ("alive", "counters", "name", "owner", "root")

    def __init__(self, name: str, counters: Counters, owner: object) -> None:
        self.name = name
        self.counters = counters
        self.owner = owner  # the RadixCache that built it (rejects foreign handles)
        self.alive = True  # False once reset() dropped it
        self.root = TreeNode([], None, 0, None, 0, self, 0)


class TreeNode:
    """One edge of the tree: a run of tokens (`key`), the value stored for them and eviction metadata.

    `RadixCache.match_prefix` hands a TreeNode out as `MatchResult.node`; callers treat it as an opaque
    handle for `lock` / `unlock`. A split never changes what a handle covers: the existing node keeps
    the deeper part and a new node is inserted above it for the shared head.

    Example:
        >>> from prefix_cache import RadixCache
        >>> cache = RadixCache(capacity_bytes=1 << 20)
        >>> node = cache.match_prefix([1, 2, 3]).node   # the namespace root: nothing cached yet
        >>> node.lock_ref, node.key
        (0, [])
    """

    __slots__ = (
        "children",
        "clock",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "nbytes",
        "own_locks",
        "parent",
        "start",
        "tree",
        "value",
    )

    def __init__(
        self,
        key: list[int],
        value: Any,
        nbytes: int,
        parent: TreeNode | None,
        start: int,
        tree: Tree,
        tick: int,
    ) -> None:
        self.key = key  # tokens on this edge: a whole number of pages
        self.value = value  # our own copy; value[i] belongs to key[i]; None once evicted
        self.nbytes = nbytes
        self.parent = parent  # None for a root and for an evicted node
        self.children: dict[Any, TreeNode] = {}  # first token (or first page tuple) -> child
        self.start = start  # tokens before this edge (its depth in tokens)
        self.tree = tree
        self.lock_ref = 0  # locks held on this node or any node below it
        self.own_locks = 0  # lock() calls made on exactly this handle (pins included)
        self.last_access_time = tick  # logical clock: refreshed along the path on match and insert
        self.hit_count = 1  # matches that went through this node (+1 for the insert)
        self.clock = 0.0  # the cache's GDSF inflation clock when this node was last touched

    @property
    def end(self) -> int:
        """Tokens from the root to the end of this node (the prefix length this handle covers)."""
        return self.start + len(self.key)

    @property
    def is_root(self) -> bool:
        return self is self.tree.root

    @property
    def evicted(self) -> bool:
        return self.parent is None and not self.is_root

    def __repr__(self) -> str:
        head = self.key[:4]
        more = "..." if len(self.key) > 4 else ""
        return (
            f"TreeNode(ns={self.tree.name!r}, tokens=[{self.start}:{self.end}] {head}{more}, "
            f"lock_ref={self.lock_ref}, nbytes={self.nbytes})"
        )
