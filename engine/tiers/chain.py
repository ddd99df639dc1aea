"""TierChain: the KV tiers under the RAM prefix cache, top to bottom (disk, then remote), as one tier.

  read:   the RAM match ─► the disk tier extends it ─► the remote tier extends what the disk left
  write:  every insert into RAM ─► each tier's writer writes the blocks that tier lacks

So a hit in a lower tier is promoted upward without a copy step of its own: the request's insert puts
the KV into RAM, and that insert's persist makes the disk tier write the blocks it lacked (blocks read
from Redis reach the local disk; blocks read from disk reach Redis, for the other hosts).

Example:
    >>> tiers = open_tiers(engine, model)          # doctest: +SKIP
    >>> tiers.extend(buffer, ids, namespace, limit=len(ids) - 1), tiers.names   # doctest: +SKIP
    (1152, ('disk', 'remote'))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from engine.exact_reuse import kernel_signature
from engine.kv.codec import compute_dtype
from engine.kv.state import KVBuffer
from engine.tiers.addresses import model_fingerprint
from engine.tiers.stats import TIER_NAMES
from engine.tiers.tier import KVTier

log = logging.getLogger(__name__)


class TierChain:
    """Tiers in order; empty when the engine has none (every call is then a no-op)."""

    def __init__(self, tiers: Sequence[KVTier] = ()) -> None:
        names = [t.name for t in tiers]
        if len(set(names)) != len(names) or not set(names) <= set(TIER_NAMES):
            raise ValueError(f"tiers must be distinct ones of {TIER_NAMES}, got {names}")
        self.tiers = tuple(tiers)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    def __bool__(self) -> bool:
        return bool(self.tiers)

    def get(self, name: str) -> KVTier | None:
        """The tier called ``name``, or None."""
        return next((t for t in self.tiers if t.name == name), None)

    def extend(self, buffer: KVBuffer, tokens: Sequence[int], namespace: str, limit: int) -> int:
        """Each tier in turn extends what the ones above it left; the tokens added in all."""
        added = 0
        for tier in self.tiers:
            if buffer.length >= min(limit, len(tokens)):
                break
            added += tier.extend(buffer, tokens, namespace, limit)
        return added

    def persist(self, namespace: str, tokens: Sequence[int]) -> None:
        for tier in self.tiers:
            tier.persist(namespace, tokens)

    def flush(self, timeout_s: float = 60.0) -> bool | None:
        """Wait for every tier's writer (one deadline for all); None when there is no tier."""
        if not self.tiers:
            return None
        deadline = time.monotonic() + timeout_s
        return all([t.flush(max(deadline - time.monotonic(), 0.0)) for t in self.tiers])

    def stats(self) -> dict[str, dict[str, Any] | None]:
        """Every tier name, with that tier's stats or None where the engine has no such tier."""
        return {name: (tier.stats() if (tier := self.get(name)) else None) for name in TIER_NAMES}

    def close(self, timeout_s: float = 30.0) -> None:
        for tier in self.tiers:
            tier.close(timeout_s)


def open_tiers(engine: Any, model: Any) -> TierChain:
    """The tiers ``engine.config`` asks for (a tier that cannot be opened is logged and left out)."""
    from engine.tiers.disk import open_disk_tier
    from engine.tiers.redis_tier import open_remote_tier

    cfg = engine.config
    wanted = (cfg.disk_cache_dir is not None and cfg.disk_cache_bytes > 0) or cfg.remote_cache_url
    if not engine.caching or not wanted:
        return TierChain()
    fingerprint = model_fingerprint(
        model,
        model_id=engine.model_id,
        dtype=str(compute_dtype(model)).removeprefix("torch."),
        kv_dtype=cfg.kv_dtype,
        weights=cfg.weights,
        kernels=kernel_signature(engine.runner),
    )
    tiers = [open_disk_tier(engine, fingerprint), open_remote_tier(engine, fingerprint)]
    return TierChain([t for t in tiers if t is not None])
