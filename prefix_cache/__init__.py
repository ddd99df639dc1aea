"""prefix_cache: a torch-free radix-tree prefix cache mapping token ids to opaque values.

Example:
    >>> import numpy as np
    >>> from prefix_cache import RadixCache
    >>> cache = RadixCache(capacity_bytes=1 << 20)
    >>> cache.insert([7, 8, 9], np.zeros((3, 2)))
    0
    >>> cache.match_prefix([7, 8, 1]).length
    2
"""

from prefix_cache.config import CacheConfig
from prefix_cache.eviction import EvictionPolicy, GDSFPolicy, LRUPolicy, make_policy, recompute_cost
from prefix_cache.node import TreeNode
from prefix_cache.radix import RadixCache
from prefix_cache.results import InsertResult, MatchResult
from prefix_cache.stats import CacheStats

__all__ = [
    "CacheConfig",
    "CacheStats",
    "EvictionPolicy",
    "GDSFPolicy",
    "InsertResult",
    "LRUPolicy",
    "MatchResult",
    "RadixCache",
    "TreeNode",
    "make_policy",
    "recompute_cost",
]
