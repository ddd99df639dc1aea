"""The query-aware selector (ProphetKV-style): recompute the reused tokens the question reads most.

A first pass runs the always-computed tokens (gaps, the question) through the layers below
``select_layer`` over the stitched KV; at ``select_layer`` the question's queries (the tokens after
the last reused chunk) meet the stitched keys, and the ``share`` of reused tokens with the most
attention (averaged over heads and question tokens) are recomputed from the first layer on, with the
always-computed tokens, in the main pass. The first pass costs the question's tokens a few layers.

Example:
    >>> selection = selector("query").select(context)      # doctest: +SKIP
    >>> selection.layer, len(selection.picks)               # doctest: +SKIP
    (0, 57)
"""

from __future__ import annotations

import torch

from engine.chunks.selection import Selection, StitchContext, from_layer_zero, register


@register("query")
class QuestionAttention:
    def select(self, ctx: StitchContext) -> Selection:
        reused = ctx.reused
        budget = ctx.budget(len(reused))
        if budget == 0:
            return from_layer_zero(ctx, [])
        prefill, layer, always = ctx.prefill, ctx.layer, ctx.always
        x = prefill.forward(ctx.buffer, prefill.embed(ctx.prompt_ids, always), always, range(layer))
        question = always >= ctx.plan.runs[-1].end  # rows after the last reused chunk
        mass = prefill.attention_mass(ctx.buffer, x, always, layer, question)  # [total]
        picks = reused[mass[reused].topk(budget).indices]
        return from_layer_zero(ctx, torch.sort(picks).values.tolist())
