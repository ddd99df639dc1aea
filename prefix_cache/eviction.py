"""Eviction policies: one small strategy class each, with one method, `priority(node)`.

The cache evicts the unlocked leaf with the lowest priority first. A priority must be a function of
the node's own fields (access time, hits, clock, size, depth): the cache keeps a lazy heap and re-queues
a leaf whenever those change (creation, access, split, unlock, its last child evicted); entries that
went stale are skipped or re-queued when they surface.
"""

from __future__ import annotations

from typing import Protocol

from prefix_cache.node import TreeNode

# Prefill FLOPs per token at position p ~ 2*P (weight matmuls, P = non-embedding params) + 4*L*d*p
# (QK^T and AV over p earlier tokens, L layers, width d). The attention term equals the matmul term at
# p = W = 2P / (4*L*d). SmolLM2-135M: P ~ 106M, L = 30, d = 576 -> W ~ 3,070 tokens.
DEFAULT_ATTENTION_WINDOW = 3072.0


class EvictionPolicy(Protocol):
    """Ranks evictable leaves: lowest priority is evicted first."""

    def priority(self, node: TreeNode) -> float: ...


class LRUPolicy:
    """Least recently used first: priority is the node's logical last access time (the default).

    Example:
        >>> from prefix_cache import RadixCache, LRUPolicy
        >>> cache = RadixCache(capacity_bytes=1 << 20, policy=LRUPolicy())
    """

    name = "lru"

    def priority(self, node: TreeNode) -> float:
        return node.last_access_time


def recompute_cost(start: int, length: int, attention_window: float = DEFAULT_ATTENTION_WINDOW) -> float:
    """Relative cost of prefilling tokens [start, start+length) again, in units of one token's matmuls.

    Token p costs 1 + p / W (its weight matmuls plus attention over p earlier tokens), so a node deep
    in the tree costs more to recompute than one of the same size near the root:
    sum over p of (1 + p/W) = length * (1 + (2*start + length - 1) / (2*W)).

    >>> recompute_cost(0, 1), recompute_cost(0, 100, 1e9) > 99.9, recompute_cost(3000, 10) > recompute_cost(0, 10)
    (1.0, True, True)
    """
    if length <= 0:
        return 0.0
    return length * (1.0 + (2 * start + length - 1) / (2.0 * attention_window))


class GDSFPolicy:
    """Cost-aware GreedyDual-Size-Frequency (RAGCache's PGDSF): priority = clock + hits x cost / bytes.

    `hits` counts matches through the node, `cost` is `recompute_cost` of its tokens at their depth and
    `bytes` its stored size, so small, popular, expensive-to-recompute prefixes stay longest. `clock`
    is the cache's inflation clock L (the priority of the last victim) as of the node's last access:
    it ages entries that stopped being used, as LRU would.

    Example:
        >>> from prefix_cache import RadixCache, GDSFPolicy
        >>> cache = RadixCache(capacity_bytes=1 << 20, policy=GDSFPolicy(attention_window=4096))
    """

    name = "gdsf"

    def __init__(self, attention_window: float = DEFAULT_ATTENTION_WINDOW) -> None:
        if not attention_window > 0:
            raise ValueError(f"attention_window must be > 0 tokens, got {attention_window!r}")
        self.attention_window = float(attention_window)

    def priority(self, node: TreeNode) -> float:
        cost = recompute_cost(node.start, len(node.key), self.attention_window)
        return node.clock + node.hit_count * cost / max(node.nbytes, 1)


POLICIES: dict[str, type[LRUPolicy] | type[GDSFPolicy]] = {"lru": LRUPolicy, "gdsf": GDSFPolicy}


def make_policy(name: str) -> EvictionPolicy:
    """The policy called `name` ("lru" or "gdsf") with default settings."""
    try:
        return POLICIES[name.lower()]()
    except (KeyError, AttributeError):
        raise ValueError(f"eviction policy must be one of {sorted(POLICIES)}, got {name!r}") from None
