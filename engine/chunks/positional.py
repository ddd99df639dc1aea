"""Selectors that choose by position alone, before any compute (``engine.chunks.selection``).

* ``none``: nothing (the naive stitch);
* ``boundary``: one token per reused chunk, its first (where the chunk meets what now precedes it);
* ``first`` (EPIC-style): the first ``share`` of each reused chunk's tokens, at least one: the chunk's
  own attention sink, right after its marker;
* ``edges``: the first and the last tokens of each chunk, ``share`` split between the two ends;
* ``tail``: the ``share`` of all reused tokens nearest the question, counted back from the last
  reused token (the chunks next to the question, whose keys the answer reads most, recomputed whole
  against what now precedes them);
* ``first_tail``: half the ``share`` as ``first`` (each chunk's sink), the rest of the budget as
  ``tail`` among the tokens ``first`` left.

``first`` and ``edges`` count a chunk's tokens from its own start (a run may begin later, where the
exact prefix match ended), rounded down, one token at least per end where the share is above zero.

Example:
    >>> from engine.chunks.plan import plan_stitch
    >>> plan = plan_stitch(40, [(2, 12), (13, 23), (24, 34)], cached=0)
    >>> first_tokens(plan, 0.2), edge_tokens(plan, 0.2), boundary_tokens(plan)
    ([13, 14, 24, 25], [13, 22, 24, 33], [13, 24])
    >>> tail_tokens(plan, 0.2)
    [30, 31, 32, 33]
"""

from __future__ import annotations

from engine.chunks.plan import ReusedRun, StitchPlan
from engine.chunks.selection import Selection, StitchContext, from_layer_zero, register


def first_tokens(plan: StitchPlan, share: float) -> list[int]:
    """The first ``share`` of each reused chunk's tokens (at least one when ``share > 0``)."""
    if share <= 0:
        return []
    return [p for run in plan.runs for p in _head(run, max(1, int(share * _chunk_length(run))))]


def edge_tokens(plan: StitchPlan, share: float) -> list[int]:
    """Half of ``share`` at each end of each reused chunk (at least one token per end)."""
    if share <= 0:
        return []
    picks: list[int] = []
    for run in plan.runs:
        half = max(1, int(share * _chunk_length(run) / 2))
        head = _head(run, half)
        picks += head + [p for p in range(max(run.end - half, run.start), run.end) if p not in head]
    return picks


def tail_tokens(plan: StitchPlan, share: float) -> list[int]:
    """The last ``share`` of all reused positions (rounded down, at least one when ``share > 0``),
    ascending: the reused tokens nearest the question."""
    if share <= 0:
        return []
    reused = [p for run in plan.runs for p in range(run.start, run.end)]
    return reused[len(reused) - max(1, int(share * len(reused))) :]


def first_tail_tokens(plan: StitchPlan, share: float) -> list[int]:
    """``first`` at half of ``share``, then the reused tokens nearest the question it left, up to
    ``share`` of the reused tokens in all (ascending)."""
    if share <= 0:
        return []
    heads = set(first_tokens(plan, share / 2))
    extra = int(share * plan.reused_tokens) - len(heads)
    rest = [p for run in plan.runs for p in range(run.start, run.end) if p not in heads]
    return sorted(heads.union(rest[len(rest) - extra :] if extra > 0 else []))


def boundary_tokens(plan: StitchPlan) -> list[int]:
    """Each reused chunk's first token (where the run holds it)."""
    return [p for run in plan.runs for p in _head(run, 1)]


def _head(run: ReusedRun, n: int) -> list[int]:
    """The run's positions among its chunk's first ``n`` tokens."""
    return list(range(run.start, run.start + max(0, min(n - run.offset, run.length))))


def _chunk_length(run: ReusedRun) -> int:
    return run.offset + run.length


@register("none")
class NoRecompute:
    def select(self, ctx: StitchContext) -> Selection:
        return from_layer_zero(ctx, [])


@register("boundary")
class BoundaryTokens:
    def select(self, ctx: StitchContext) -> Selection:
        return from_layer_zero(ctx, boundary_tokens(ctx.plan))


@register("first")
class FirstTokens:
    def select(self, ctx: StitchContext) -> Selection:
        return from_layer_zero(ctx, first_tokens(ctx.plan, ctx.policy.share))


@register("edges")
class EdgeTokens:
    def select(self, ctx: StitchContext) -> Selection:
        return from_layer_zero(ctx, edge_tokens(ctx.plan, ctx.policy.share))


@register("tail")
class TailTokens:
    def select(self, ctx: StitchContext) -> Selection:
        return from_layer_zero(ctx, tail_tokens(ctx.plan, ctx.policy.share))


@register("first_tail")
class FirstTailTokens:
    def select(self, ctx: StitchContext) -> Selection:
        return from_layer_zero(ctx, first_tail_tokens(ctx.plan, ctx.policy.share))
