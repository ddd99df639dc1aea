"""The stitched prefill: cached chunk KV placed at new positions, a few tokens recomputed over it.

Given a buffer that holds the exact part of the prompt and, at each reused run's positions, the chunk's
canonical KV (``place_run``: keys re-rotated by the position delta), ``StitchedPrefill.run`` computes
the tokens that must be computed (gaps, question) plus a selection of reused tokens, layer by layer:
a computed token's fresh K/V overwrite the stitched ones at every layer, and its query attends
causally over the whole stitched context (an explicit mask over explicit positions). Built from the
fused runner's own layer loop at explicit positions (``run_at``, ``run_layers``; ``layer_kv`` for one
layer's fresh K/V).

Which reused tokens are recomputed is the policy's strategy, a selector looked up by name
(``engine.chunks.selection``: ``none``, ``boundary``, ``first``, ``edges``, ``deviation``, ``query``).

The run also estimates how far the result is from exact (``StitchStats.deviation``): the share of
the attention the question's tokens pay, at ``select_layer`` of the main pass, to chunk tokens whose
KV stayed stitched (0: the question read no stitched KV there; every prompt token computed gives 0).

Example:
    >>> stitched = StitchedPrefill(runner)                               # doctest: +SKIP
    >>> for run, segment in zip(plan.runs, sources):                     # doctest: +SKIP
    ...     place_run(runner, buffer, run, segment)
    >>> logits, stats = stitched.run(buffer, prompt_ids, plan, ChunkReuse())    # doctest: +SKIP
    >>> stats.deviation                                                   # doctest: +SKIP
    0.31
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from engine.chunks.plan import ReusedRun, StitchPlan
from engine.chunks.reuse import ChunkReuse
from engine.chunks.selection import StitchContext, selector
from engine.fused import FusedLlamaRunner
from engine.fused_attention import PositionsAttention
from engine.kv.state import KVBuffer, KVSegment
from engine.native.key_rotation import DTYPES as NATIVE_DTYPES
from engine.native.key_rotation import native_rotation


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
    native = native_rotation()
    if native is not None and runner.kv_format_identity and keys.dtype in NATIVE_DTYPES:
        native(keys, cos.contiguous(), sin.contiguous())  # rotate_keys' bits, in one call
        return
    # rounded through the KV format, as the runner's own writes are
    keys.copy_(runner.kv_format(rotate_keys(keys, cos, sin)))


@dataclass
class StitchStats:
    """What one stitched prefill recomputed (reused positions), seconds spent selecting them, and
    the share of the question's attention on the stitched KV left as it was (see the module doc)."""

    recomputed_positions: list[int] = field(default_factory=list)
    select_s: float = 0.0
    deviation: float = 0.0


class StitchedPrefill:
    """Runs the computed and selected tokens of a stitched prompt through the fused runner's layers."""

    def __init__(self, runner: FusedLlamaRunner) -> None:
        self.runner = runner

    @torch.inference_mode()
    def run(
        self, buffer: KVBuffer, prompt_ids: Sequence[int], plan: StitchPlan, policy: ChunkReuse
    ) -> tuple[torch.Tensor, StitchStats]:
        """Float32 logits of the last prompt position; ``buffer`` holds the whole prompt afterwards."""
        always = torch.tensor(plan.computed_positions(), dtype=torch.long)
        ctx = StitchContext(self, buffer, prompt_ids, plan, policy, always)
        clock = time.perf_counter()
        chosen = selector(policy.strategy).select(ctx)
        stats = StitchStats(chosen.picks, time.perf_counter() - clock)
        question = chosen.positions >= plan.runs[-1].end
        watch = (ctx.layer, question) if chosen.layer <= ctx.layer else None
        x, mass = self.forward_watched(
            buffer, chosen.x, chosen.positions, range(chosen.layer, self.runner.num_layers), watch
        )
        if mass is not None:
            stitched = torch.ones(plan.total, dtype=torch.bool)
            stitched[chosen.positions] = False  # computed now: exact for the stitched context
            stitched[: plan.exact_end] = False
            stats.deviation = float(mass[stitched[: mass.shape[0]]].sum())
        buffer.set_length(plan.total)
        return self.runner.last_logits(x, exact=False), stats

    def embed(self, prompt_ids: Sequence[int], positions: torch.Tensor) -> torch.Tensor:
        """Input hidden states ``[T, hidden]`` of the tokens at ``positions``."""
        return self.runner.embed_ids([prompt_ids[p] for p in positions.tolist()])

    @torch.inference_mode()
    def forward(
        self, buffer: KVBuffer, x: torch.Tensor, positions: torch.Tensor, layers: range
    ) -> torch.Tensor:
        """Run ``x`` (hidden states of ``positions``, ascending) through ``layers``: each writes the
        tokens' K/V at their positions, then attends causally over the stitched context."""
        return self.runner.run_at(buffer, x, positions, layers)

    @torch.inference_mode()
    def forward_watched(
        self,
        buffer: KVBuffer,
        x: torch.Tensor,
        positions: torch.Tensor,
        layers: range,
        watch: tuple[int, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward``, and at ``watch = (layer, rows)`` the attention ``rows`` pay to each key
        position (``attention_mass``) once that layer's K/V are written (None without a watch)."""
        if watch is None:
            return self.forward(buffer, x, positions, layers), None
        attention = _Watched(
            PositionsAttention(buffer, positions, self.runner.scale, self.runner.attention),
            *watch,
            self._mass,
        )
        return self.runner.run_layers(x, positions, attention, layers, exact=False), attention.mass

    @torch.inference_mode()
    def attention_mass(
        self, buffer: KVBuffer, x: torch.Tensor, positions: torch.Tensor, layer: int, rows: torch.Tensor
    ) -> torch.Tensor:
        """At ``layer`` (``x``: the hidden states of ``positions`` entering it, every position the
        buffer does not hold yet included), write their K/V and return the attention the ``rows``
        (a mask over them) pay to each key position, averaged over heads and rows: ``[total]``."""
        mass = self.forward_watched(buffer, x, positions, range(layer, layer + 1), (layer, rows))[1]
        assert mass is not None
        return mass

    def _mass(self, q: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        # q [R, H, D], mask [R, total], keys [KVH, total, D] -> [total]: mean softmax weight per key
        r = self.runner
        group = r.heads // r.kv_heads
        kh = keys.float().repeat_interleave(group, dim=0)  # [H, total, D]
        scores = torch.einsum("rhd,htd->rht", q.float(), kh) * r.scale
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return torch.softmax(scores, dim=-1).mean(dim=(0, 1))


class _Watched:
    """An ``Attention`` that, at one layer, also measures the attention some rows pay to each key."""

    def __init__(
        self,
        inner: PositionsAttention,
        layer: int,
        rows: torch.Tensor,
        measure: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        self.inner, self.layer, self.rows, self.measure = inner, layer, rows, measure
        self.mass: torch.Tensor | None = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.inner.write(layer, k, v)

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if layer == self.layer:
            keys = self.inner.k_store[layer, 0, :, : self.inner.total]
            self.mass = self.measure(q[self.rows], self.inner.mask[self.rows], keys)
        return self.inner.attend(layer, q)
