"""ChunkStitcher: a ``chunks``-mode prefill, from the plan to the first token's logits.

  plan (engine.chunks.plan) ─► the engine prefills the exact part ``[0, exact_end)`` as in prefix mode
  ─► ChunkSources.fetch: each reused chunk's canonical KV (cache, or prefilled at its placement now)
  ─► place_run: copied into the request's buffer, keys re-rotated to the chunk's position
  ─► StitchedPrefill.run: gaps, question and the selected chunk tokens computed over the stitched KV
  ─► logits; after the first token the engine inserts the computed placements (exact KV) and the
     exact part of the prompt, never the stitched KV.

Example:
    >>> stitcher = ChunkStitcher(cache, runner, buffers)                          # doctest: +SKIP
    >>> out = stitcher.stitch(buffer, ids, spans, plan, ChunkReuse(), "m\\x1ft")  # doctest: +SKIP
    >>> out.stitched_tokens, out.recomputed_tokens, out.phases                    # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.chunks.plan import Span, StitchPlan
from engine.chunks.reuse import ChunkReuse
from engine.chunks.sources import ChunkKV, ChunkSources
from engine.chunks.stitch import StitchedPrefill, place_run
from engine.fused import FusedLlamaRunner
from engine.kv.buffer_pool import BufferPool
from engine.kv.state import KVBuffer
from prefix_cache import RadixCache


@dataclass
class Stitched:
    """A finished stitched prefill. Of the prompt tokens taken from chunk placements the cache held,
    ``stitched_tokens`` kept their (rotated) KV and ``recomputed_tokens`` were computed again;
    ``prefilled_tokens``: tokens computed at the placements now (chunk tokens not cached before, which
    are stitched and recomputed like the others, and the plan's context where the cache lacked it). ``deviation``: the stitched prefill's estimate of how
    far it is from exact (``engine.chunks.stitch``). ``phases``: seconds (``stitch_load``: lookups,
    copies and rotation; ``stitch_select``; ``chunk_prefill``; ``stitch_compute``)."""

    logits: torch.Tensor
    exact_end: int
    stitched_tokens: int
    recomputed_tokens: int
    prefilled_tokens: int
    kv: ChunkKV
    deviation: float = 0.0
    recomputed_positions: list[int] = field(default_factory=list)  # of every reused run, cached or not
    phases: dict[str, float] = field(default_factory=dict)


class ChunkStitcher:
    """Fetches, places and recomputes the reused chunks of one prompt over the fused runner."""

    def __init__(
        self, cache: RadixCache, runner: FusedLlamaRunner, buffers: BufferPool, disk: Any = None
    ) -> None:
        self.sources = ChunkSources(cache, runner, buffers, disk)
        self.runner = runner
        self.prefill = StitchedPrefill(runner)

    def stitch(
        self,
        buffer: KVBuffer,
        prompt_ids: Sequence[int],
        spans: Sequence[Span],
        plan: StitchPlan,
        policy: ChunkReuse,
        namespace: str,
        cancelled: threading.Event | None = None,
    ) -> Stitched:
        """``buffer`` holds exactly ``[0, plan.exact_end)``; afterwards the whole prompt. Raises
        ``RequestCancelled`` if ``cancelled`` is set before the forward pass starts."""
        clock = time.perf_counter()
        kv = self.sources.fetch(prompt_ids, spans, plan, buffer, namespace, cancelled)
        try:
            self._place(buffer, plan, kv)
        finally:
            self.sources.release(kv)
        load_s = time.perf_counter() - clock - kv.prefill_s
        clock = time.perf_counter()
        logits, stats = self.prefill.run(buffer, prompt_ids, plan, policy)
        compute_s = time.perf_counter() - clock
        picked = set(stats.recomputed_positions)
        cached_runs = [run for run, hit in zip(plan.runs, kv.from_cache, strict=True) if hit]
        reused = sum(run.length for run in cached_runs)
        recomputed = sum(1 for run in cached_runs for p in range(run.start, run.end) if p in picked)
        return Stitched(
            logits=logits,
            exact_end=plan.exact_end,
            stitched_tokens=reused - recomputed,
            recomputed_tokens=recomputed,
            prefilled_tokens=kv.prefilled_tokens,
            kv=kv,
            deviation=stats.deviation,
            recomputed_positions=stats.recomputed_positions,
            phases={
                "stitch_load": load_s,
                "chunk_prefill": kv.prefill_s,
                "stitch_select": stats.select_s,
                "stitch_compute": compute_s - stats.select_s,
            },
        )

    def recycle(self, stitched: Stitched) -> None:
        """Free the scratch storage of the placements computed now (once inserted, or to drop them)."""
        self.sources.recycle(stitched.kv)

    def _place(self, buffer: KVBuffer, plan: StitchPlan, kv: ChunkKV) -> None:
        buffer.reserve(plan.total)
        for run, segment in zip(plan.runs, kv.segments):
            buffer.set_length(run.start)  # gap tokens before the run: written by the forward pass
            place_run(self.runner, buffer, run, segment)
