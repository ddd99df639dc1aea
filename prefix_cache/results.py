"""Result types of RadixCache.match_prefix and RadixCache.insert_detailed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefix_cache.node import TreeNode


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The longest cached prefix of a query.

    `values` are the stored per-node values in order (read-only: they are the cache's own copies);
    concatenated along axis 0 they equal the values inserted for tokens[:length]. `node` covers exactly
    those `length` tokens (a match ending inside a node splits it); for length 0 it is the namespace
    root, on which lock / unlock are no-ops.

    Example:
        >>> import numpy as np
        >>> from prefix_cache import RadixCache
        >>> cache = RadixCache(capacity_bytes=1 << 20)
        >>> _ = cache.insert([1, 2, 3], np.array([10, 20, 30]))
        >>> m = cache.match_prefix([1, 2, 7])
        >>> m.length, [v.tolist() for v in m.values]
        (2, [[10, 20]])
    """

    length: int
    values: list[Any]
    node: TreeNode


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What an insert did with each token: already_cached + stored + dropped + unaligned == len(tokens).

    `dropped` tokens did not fit in capacity_bytes even after evicting every unlocked leaf (only the
    prefix that fits is stored); `unaligned` is the tail short of a whole page, never stored.
    """

    already_cached: int
    stored: int
    dropped: int
    unaligned: int = 0
