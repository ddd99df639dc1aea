"""The stitched prefill: cached chunk KV placed at new positions, a few tokens recomputed over it.

Given a buffer that holds the exact part of the prompt and, at each reused run's positions, the chunk's
canonical KV (``place_run``: keys re-rotated by the position delta), ``StitchedPrefill.run`` computes
the tokens that must be computed (gaps, question) plus a selection of reused tokens, layer by layer:
a computed token's fresh K/V overwrite the stitched ones at every layer, and its query attends
causally over the whole stitched context (an explicit mask over explicit positions): the fused
runner's own layer loop at explicit positions (``run_at``; ``layer_kv`` for one layer's fresh K/V).

Selection (``ChunkReuse.strategy``):
  * ``none``: no reused token is recomputed (the naive stitch);
  * ``first``: the first ``share`` of each reused chunk (its marker-side head, the chunk's own
    attention sink), at least one token per chunk;
  * ``deviation`` (CacheBlend): layers ``< deviation_layer`` run for every reused token (their K/V
    are then exact), at ``deviation_layer`` the ``share`` of reused tokens whose fresh K/V differ most
    from the stitched ones is kept, and only those continue.

Example:
    >>> stitched = StitchedPrefill(runner)                               # doctest: +SKIP
    >>> for run, segment in zip(plan.runs, sources):                     # doctest: +SKIP
    ...     place_run(runner, buffer, run, segment)
    >>> logits = stitched.run(buffer, prompt_ids, plan, ChunkReuse())    # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.chunks.plan import ReusedRun, StitchPlan
from engine.chunks.reuse import ChunkReuse
from engine.fused import FusedLlamaRunner
from engine.kv.state import KVBuffer, KVSegment


def rotation(runner: FusedLlamaRunner, delta: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[head_dim]`` (float32) that move a post-RoPE key ``delta`` positions on."""
    pos = torch.tensor([[delta]], device=runner.device)
    cos, sin = runner.rotary(torch.zeros(1, device=runner.device, dtype=torch.float32), pos)
    return cos[0, 0], sin[0, 0]


def rotate_keys(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE rotation of ``keys [..., head_dim]`` in float32: R(d) R(p) k = R(p + d) k."""
    k = keys.float()
    half = k.shape[-1] // 2
    return k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin


@torch.inference_mode()
def place_run(runner: FusedLlamaRunner, buffer: KVBuffer, run: ReusedRun, segment: KVSegment) -> None:
    """Copy a run's canonical KV into ``buffer`` at ``run.start`` (which it must hold exactly up to),
    keys rotated ``run.delta`` positions on. The buffer is then declared ``run.end`` tokens long."""
    buffer.load_prefix([segment], start=run.start)
    k_store, _ = buffer.stores()
    cos, sin = rotation(runner, run.delta)
    keys = k_store[:, 0, :, run.start : run.end]  # [layers, kv_heads, n, head_dim]
    # rounded through the KV format, as the runner's own writes are
    keys.copy_(runner.kv_format(rotate_keys(keys, cos, sin)))


@dataclass
class StitchStats:
    """What one stitched prefill recomputed (reused positions), and seconds spent selecting them."""

    recomputed_positions: list[int] = field(default_factory=list)
    select_s: float = 0.0


class StitchedPrefill:
    """Runs the computed and selected tokens of a stitched prompt through the fused runner's layers."""

    def __init__(self, runner: FusedLlamaRunner) -> None:
        self.runner = runner

    @torch.inference_mode()
    def run(
        self, buffer: KVBuffer, prompt_ids: Sequence[int], plan: StitchPlan, policy: ChunkReuse
    ) -> tuple[torch.Tensor, StitchStats]:
        """Float32 logits of the last prompt position; ``buffer`` holds the whole prompt afterwards."""
        stats = StitchStats()
        always = torch.tensor(plan.computed_positions(), dtype=torch.long)
        if policy.strategy == "deviation" and policy.share > 0:
            x = self._deviation(buffer, prompt_ids, plan, policy, always, stats)
        else:
            picks = first_tokens(plan, policy.share) if policy.strategy == "first" else []
            chosen = torch.tensor(sorted([*always.tolist(), *picks]), dtype=torch.long)
            stats.recomputed_positions = picks
            x = self._layers(buffer, self._embed(prompt_ids, chosen), chosen, range(self.runner.num_layers))
        buffer.set_length(plan.total)
        return self.runner.last_logits(x), stats

    def _deviation(
        self,
        buffer: KVBuffer,
        prompt_ids: Sequence[int],
        plan: StitchPlan,
        policy: ChunkReuse,
        always: torch.Tensor,
        stats: StitchStats,
    ) -> torch.Tensor:
        reused = torch.tensor([p for run in plan.runs for p in range(run.start, run.end)], dtype=torch.long)
        every = torch.sort(torch.cat([always, reused])).values
        layer = min(policy.deviation_layer, self.runner.num_layers - 1)
        x = self._layers(buffer, self._embed(prompt_ids, every), every, range(layer))
        budget = min(int(policy.share * len(reused)), len(reused))  # never over the share
        clock = time.perf_counter()
        picks = self._most_deviating(buffer, x, every, reused, layer, budget)
        chosen = torch.sort(torch.cat([always, picks])).values
        rows = torch.searchsorted(every, chosen)  # chosen positions are rows of `every`
        stats.select_s, stats.recomputed_positions = time.perf_counter() - clock, picks.tolist()
        return self._layers(buffer, x[rows], chosen, range(layer, self.runner.num_layers))

    def _most_deviating(
        self,
        buffer: KVBuffer,
        x: torch.Tensor,
        every: torch.Tensor,
        reused: torch.Tensor,
        layer: int,
        budget: int,
    ) -> torch.Tensor:
        """The ``budget`` reused positions whose fresh K/V at ``layer`` differ most from the stitched.
        Every reused token's fresh K/V at ``layer`` replace the stitched ones (its input is exact)."""
        r = self.runner
        rows = torch.searchsorted(every, reused)
        k, v = r.layer_kv(layer, x[rows], reused)  # [n, KVH, D]
        k_store, v_store = buffer.stores()
        old_k = k_store[layer, 0][:, reused].transpose(0, 1)  # [n, KVH, D]
        old_v = v_store[layer, 0][:, reused].transpose(0, 1)
        deviation = _squared_distance(k, old_k) + _squared_distance(v, old_v)
        k_store[layer, 0][:, reused] = k.transpose(0, 1)
        v_store[layer, 0][:, reused] = v.transpose(0, 1)
        return torch.sort(reused[deviation.topk(budget).indices]).values

    def _embed(self, prompt_ids: Sequence[int], positions: torch.Tensor) -> torch.Tensor:
        return self.runner.embed_ids([prompt_ids[p] for p in positions.tolist()])  # [T, hidden]

    def _layers(
        self, buffer: KVBuffer, x: torch.Tensor, positions: torch.Tensor, layers: range
    ) -> torch.Tensor:
        """Run ``x`` (hidden states of ``positions``, ascending) through ``layers``: each writes the
        tokens' K/V at their positions, then attends causally over the stitched context."""
        return self.runner.run_at(buffer, x, positions, layers)


def first_tokens(plan: StitchPlan, share: float) -> list[int]:
    """Positions of the first ``share`` of each reused chunk's tokens (rounded down, at least one per
    chunk when ``share > 0``), counted from the chunk's own start, within the run."""
    if share <= 0:
        return []
    picks: list[int] = []
    for run in plan.runs:
        chunk_len = run.offset + run.length
        head = max(1, int(share * chunk_len))  # never over the share, but one token at least
        picks.extend(range(run.start, run.start + max(0, min(head - run.offset, run.length))))
    return picks


def _squared_distance(fresh: torch.Tensor, stitched: torch.Tensor) -> torch.Tensor:
    # [n, KVH, D] x2 -> [n]
    return (fresh.float() - stitched.float()).pow(2).sum((1, 2))
