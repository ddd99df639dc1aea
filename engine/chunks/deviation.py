"""CacheBlend's selector: the reused tokens whose K/V deviate most from a fresh computation.

Layers below ``select_layer`` run for every reused token (their K/V are then exact for the stitched
context); at ``select_layer`` every reused token's fresh K/V replace the stitched ones, and the
``share`` whose fresh K/V differ most from the stitched (squared distance) continue through the
remaining layers with the always-computed tokens.

Example:
    >>> selection = selector("deviation").select(context)      # doctest: +SKIP
    >>> selection.layer == context.layer                         # doctest: +SKIP
    True
"""

from __future__ import annotations

import torch

from engine.chunks.selection import Selection, StitchContext, from_layer_zero, register


@register("deviation")
class MostDeviating:
    def select(self, ctx: StitchContext) -> Selection:
        prefill, layer = ctx.prefill, ctx.layer
        reused = ctx.reused
        budget = ctx.budget(len(reused))
        if budget == 0:  # nothing to choose: the stitched KV stays as it is (the naive stitch)
            return from_layer_zero(ctx, [])
        every = torch.sort(torch.cat([ctx.always, reused])).values
        x = prefill.forward(ctx.buffer, prefill.embed(ctx.prompt_ids, every), every, range(layer))
        picks = self._most_deviating(ctx, x, every, reused, budget)
        chosen = torch.sort(torch.cat([ctx.always, picks])).values
        rows = torch.searchsorted(every, chosen)  # chosen positions are rows of `every`
        return Selection(x[rows], chosen, layer, picks.tolist())

    @staticmethod
    def _most_deviating(
        ctx: StitchContext, x: torch.Tensor, every: torch.Tensor, reused: torch.Tensor, budget: int
    ) -> torch.Tensor:
        """The ``budget`` reused positions whose fresh K/V at the layer differ most from the stitched;
        every reused token's fresh K/V replace the stitched ones there (its input is exact)."""
        r, layer = ctx.prefill.runner, ctx.layer
        rows = torch.searchsorted(every, reused)
        k, v = r.layer_kv(layer, x[rows], reused)  # [n, KVH, D], in the cache's format
        k_store, v_store = ctx.buffer.stores()
        old_k = k_store[layer, 0][:, reused].transpose(0, 1)  # [n, KVH, D]
        old_v = v_store[layer, 0][:, reused].transpose(0, 1)
        deviation = _squared_distance(k, old_k) + _squared_distance(v, old_v)
        k_store[layer, 0][:, reused] = k.transpose(0, 1)
        v_store[layer, 0][:, reused] = v.transpose(0, 1)
        return torch.sort(reused[deviation.topk(budget).indices]).values


def _squared_distance(fresh: torch.Tensor, stitched: torch.Tensor) -> torch.Tensor:
    # [n, KVH, D] x2 -> [n]
    return (fresh.float() - stitched.float()).pow(2).sum((1, 2))
