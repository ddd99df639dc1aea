"""Where a reused chunk's KV comes from: its canonical placement ``anchor + context + chunk`` in the
exact tree, else the tiers under it (disk, remote).

The radix path ``anchor + context + chunk`` holds the KV a chunk got standing after the real system
prompt and a fixed stand-in for the passages before it (``StitchPlan.context``; the assembler's
stand-in passage and second marker, so the chunk's KV is that of a chunk which is not first, as
it will be wherever it is reused). A chunk the cache does not hold (in full) is prefilled at that
placement now, in scratch storage, after the longest prefix of the placement the cache does hold
(at least the anchor, from the request's buffer; the context once and then from the cache): that KV
is exact for the token sequence ``anchor + context + chunk``, so it may go into the exact tree, and
the next request that retrieves the chunk reuses it. A placement the RAM tree lacks is read from the
tiers first (as much of it as they hold; the rest is prefilled) and promoted into the tree the same
way; its insert writes it to every tier, so other replicas and hosts reuse it too. The insert waits
until the request's first token is out, like the prompt's own insert.

Example:
    >>> sources = ChunkSources(cache, runner, buffers)                        # doctest: +SKIP
    >>> kv = sources.fetch(prompt_ids, spans, plan, buffer, namespace="m\\x1ft")  # doctest: +SKIP
    >>> try: ...  # place kv.segments
    ... finally: sources.release(kv)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.chunks.plan import Span, StitchPlan
from engine.fused import FusedLlamaRunner
from engine.kv.buffer_pool import BufferPool
from engine.kv.state import KVBuffer, KVSegment
from engine.tiers.chain import TierChain
from prefix_cache import RadixCache


class RequestCancelled(Exception):
    """The request was cancelled while its chunks were being prepared."""


@dataclass
class ChunkKV:
    """The canonical KV of each reused run, and what producing it left to do."""

    segments: list[KVSegment] = field(default_factory=list)  # per run: the run's tokens, canonical KV
    from_cache: list[bool] = field(default_factory=list)  # per run: the cache held it (else computed now)
    placements: list[tuple[list[int], KVSegment]] = field(default_factory=list)  # for the exact tree
    scratch: list[KVBuffer] = field(default_factory=list)  # storage the computed placements live in
    locked: list[Any] = field(default_factory=list)  # cache nodes held until the runs are placed
    prefilled_tokens: int = 0
    prefill_s: float = 0.0


class ChunkSources:
    """Looks up (or computes) the canonical KV of a stitched prompt's reused chunks."""

    def __init__(
        self, cache: RadixCache, runner: FusedLlamaRunner, buffers: BufferPool, tiers: TierChain | None = None
    ) -> None:
        self.cache = cache
        self.runner = runner
        self.buffers = buffers
        self.tiers = tiers or TierChain()

    def fetch(
        self,
        prompt_ids: Sequence[int],
        spans: Sequence[Span],
        plan: StitchPlan,
        buffer: KVBuffer,
        namespace: str,
        cancelled: threading.Event | None = None,
    ) -> ChunkKV:
        """Each run's KV; ``buffer`` must hold the prompt's anchor exactly (its KV seeds a prefill).
        Call ``release`` once the segments are placed (also on error)."""
        kv = ChunkKV()
        head = [*prompt_ids[: plan.anchor], *plan.context]
        head_kv: KVSegment | None = None  # computed here already: later placements start from it
        try:
            for run in plan.runs:
                if cancelled is not None and cancelled.is_set():
                    raise RequestCancelled
                start, end = spans[run.chunk]
                key = head + list(prompt_ids[start:end])
                match = self.cache.match_prefix(key, namespace=namespace, lock=True, count=False)
                kv.locked.append(match.node)
                if match.length == len(key):
                    kv.from_cache.append(True)
                    whole = KVSegment.concat(match.values)
                else:
                    seed = [head_kv] if head_kv is not None and match.length < len(head) else match.values
                    whole = self._compute(key, seed, buffer, plan.anchor, namespace, kv)
                    head_kv = head_kv or whole[: len(head)]
                lo = plan.placement_start + run.offset
                kv.segments.append(whole[lo : lo + run.length])
        except BaseException:
            self.release(kv)
            raise
        return kv

    def release(self, kv: ChunkKV) -> None:
        """Unlock the cache nodes the fetch held (idempotent)."""
        for node in kv.locked:
            self.cache.unlock(node)
        kv.locked.clear()

    def recycle(self, kv: ChunkKV) -> None:
        """Hand the scratch storage back (after the placements were inserted or dropped)."""
        kv.placements.clear()
        kv.segments.clear()
        for scratch in kv.scratch:
            self.buffers.give(scratch)
        kv.scratch.clear()

    def _compute(
        self,
        key: list[int],
        cached: Sequence[KVSegment],
        buffer: KVBuffer,
        anchor: int,
        namespace: str,
        kv: ChunkKV,
    ) -> KVSegment:
        """``key``'s KV in scratch storage: the ``cached`` prefix of it, what the tiers hold after
        that, the anchor's KV from the request's buffer where both stopped short of it, the rest
        prefilled after them."""
        clock = time.perf_counter()
        scratch = self.buffers.take(self.runner.new_buffer, len(key))
        kv.scratch.append(scratch)
        scratch.extend(cached)
        self.tiers.extend(scratch, key, namespace, limit=len(key))
        held = scratch.length
        if held < anchor:
            scratch.extend([buffer.segment(held, anchor)])
            held = anchor
        if held < len(key):
            self.runner.prefill(key[held:], scratch)
        whole = scratch.segment(0, len(key))
        kv.placements.append((key, whole))
        kv.from_cache.append(held == len(key))
        kv.prefilled_tokens += len(key) - held
        kv.prefill_s += time.perf_counter() - clock
        return whole
