"""KVTier: what the engine needs from a KV tier under the RAM prefix cache (SGLang's HiCacheStorage,
LMCache's storage backends): extend a request's match with what the tier holds, persist what the RAM
cache just took (write-behind), flush, stats, close. The disk tier and the Redis tier implement it
(both are `engine.tiers.block_tier.BlockTier`s over a different store); `engine.tiers.chain.TierChain`
puts them under one another.

Every method is an optimisation and never fails a request: a tier that cannot read returns 0 (the
caller computes the rest), one that cannot write drops the write.

Example:
    >>> added = tier.extend(buffer, prompt_ids, namespace, limit=len(prompt_ids) - 1)  # doctest: +SKIP
    >>> tier.persist(namespace, prompt_ids)                                           # doctest: +SKIP
    >>> tier.stats()["hit_tokens"]                                                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from engine.kv.state import KVBuffer


class KVTier(Protocol):
    name: str  # one of engine.tiers.stats.TIER_NAMES

    def extend(self, buffer: KVBuffer, tokens: Sequence[int], namespace: str, limit: int) -> int:
        """Append to ``buffer`` (which holds ``tokens[:buffer.length]``) the KV of the tokens after it
        that the tier holds, up to ``limit`` tokens in all; the tokens added (0 on any failure)."""
        ...

    def persist(self, namespace: str, tokens: Sequence[int]) -> None:
        """Queue ``tokens`` (just inserted into the RAM cache, which holds their KV) for writing."""
        ...

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued write is done; False if ``timeout_s`` passed first."""
        ...

    def stats(self) -> dict[str, Any]:
        """Every key of engine.tiers.stats.TIER_STATS, and where the tier keeps its blocks."""
        ...

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the tier's threads."""
        ...
