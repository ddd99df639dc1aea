"""The oracle: the token hit rate an unbounded prefix cache would reach on a stream of prompts.

Written independently of ``prefix_cache.RadixCache`` (a set of prefix fingerprints per namespace
instead of a tree), so that agreeing with the radix cache at unbounded capacity is a real check.
Like the engine, it caps every hit at ``len(prompt) - 1`` (one token is always computed).

Example:
    >>> o = PrefixOracle()
    >>> o.serve([1, 2, 3, 4]), o.serve([1, 2, 3, 9]), o.serve([1, 2, 3, 4]), o.serve([1, 2], "tenant-b")
    (0, 3, 3, 0)
    >>> round(o.hit_rate, 3)                  # 6 hit tokens of 14
    0.429
"""

from __future__ import annotations

from collections.abc import Sequence


class PrefixOracle:
    """An unbounded prefix cache: every prefix of every prompt served stays cached forever."""

    def __init__(self) -> None:
        self._prefixes: dict[str, set[int]] = {}
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def peek(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """Length of the longest cached prefix of ``token_ids`` (uncapped, no side effects)."""
        seen = self._prefixes.get(namespace)
        if not seen:
            return 0
        h = _ROOT
        for n, token in enumerate(token_ids):
            h = hash((h, token))
            if h not in seen:
                return n
        return len(token_ids)

    def add(self, token_ids: Sequence[int], namespace: str = "") -> None:
        """Cache every prefix of ``token_ids``."""
        seen = self._prefixes.setdefault(namespace, set())
        h = _ROOT
        for token in token_ids:
            h = hash((h, token))
            seen.add(h)

    def serve(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """What an engine with this cache reuses for a request (capped at len-1); then caches it."""
        hit = min(self.peek(token_ids, namespace), max(len(token_ids) - 1, 0))
        self.add(token_ids, namespace)
        self.prompt_tokens += len(token_ids)
        self.hit_tokens += hit
        return hit

    @property
    def hit_rate(self) -> float:
        """Token hit rate so far: hit tokens / prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def cached_tokens(self) -> int:
        """Distinct prefixes held, i.e. the tokens an unbounded radix tree would store."""
        return sum(len(s) for s in self._prefixes.values())


_ROOT = hash("prefixrag-oracle-root")


def oracle_hits(prompts: Sequence[tuple[Sequence[int], str]]) -> list[int]:
    """Per-request hits of an unbounded cache on ``(token_ids, namespace)`` prompts, in order.

    >>> oracle_hits([([5, 6, 7], ""), ([5, 6, 8], ""), ([5, 6, 7], "b")])
    [0, 2, 0]
    """
    oracle = PrefixOracle()
    return [oracle.serve(ids, ns) for ids, ns in prompts]
