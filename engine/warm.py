"""Warming: prefill a list of prompts into the prefix cache (and the tiers under it) before traffic arrives.

Example:
    >>> result = engine.warm(["You are a helpful assistant."], namespace="team-a")  # doctest: +SKIP
    >>> result.prompts, result.prompt_tokens, result.disk_written                   # doctest: +SKIP
    (1, 9, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.encoding import PromptInput
from engine.sampling import SamplingParams

if TYPE_CHECKING:
    from engine.engine import Engine


@dataclass(frozen=True)
class WarmResult:
    """What a warm-up did: prompts and their tokens, how many were already cached (so not computed),
    and whether the tiers under RAM (disk, remote) finished writing (None: the engine has none)."""

    prompts: int
    prompt_tokens: int
    cached_tokens: int
    disk_written: bool | None


def warm_prompts(
    engine: Engine,
    prompts: Sequence[PromptInput],
    *,
    namespace: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> WarmResult:
    """Prefill each prompt (one sampled token, discarded) so its KV is cached; every prompt is validated
    before any work starts."""
    if isinstance(prompts, (str, bytes)):
        raise ValueError("prompts must be a list of prompts, not a single string")
    encoded = [engine.encode(p) for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids or len(ids) >= engine.max_context:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; it needs 1 to {engine.max_context - 1}")
    total = cached = 0
    for i, ids in enumerate(encoded):
        result = engine.generate(ids, SamplingParams(max_tokens=1), namespace=namespace)
        total += result.prompt_tokens
        cached += result.cached_tokens
        if progress is not None:
            progress(i + 1, len(encoded))
    written = engine.flush_tiers()
    return WarmResult(len(encoded), total, cached, written)
