"""Helpers shared by the prefix_cache tests (imported by module name; not a test file)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from prefix_cache import RadixCache, TreeNode

BYTES_PER_TOKEN = 8  # prefix_values() rows are one int64


def prefix_values(tokens: Sequence[int]) -> np.ndarray:
    """Value row i is a hash of tokens[:i+1], so any correct cache returns the same rows for a prefix."""
    out = np.empty(len(tokens), dtype=np.int64)
    h = 17
    for i, t in enumerate(tokens):
        h = (h * 1_000_003 + int(t) + 1) % (1 << 61)
        out[i] = h
    return out


def joined(values: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(values) if values else np.empty(0, dtype=np.int64)


def nodes(cache: RadixCache, namespace: str = "") -> Iterator[TreeNode]:
    tree = cache._trees.get(namespace)
    stack = [tree.root] if tree else []
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.is_root:
            yield node


def contents(cache: RadixCache, namespace: str = "") -> dict[tuple[int, ...], int]:
    """Every cached whole-page prefix -> the value row stored for its last token (brute force)."""
    out: dict[tuple[int, ...], int] = {}
    page = cache.page_size
    for node in nodes(cache, namespace):
        path: list[int] = []
        p = node.parent
        while p is not None and not p.is_root:
            path[:0] = p.key
            p = p.parent
        for i in range(page - 1, len(node.key), page):
            out[(*path, *node.key[: i + 1])] = int(node.value[i])
    return out
