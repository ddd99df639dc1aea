"""Which prompt tokens a ``chunks``-mode request reuses from cached chunks, and which it computes.

A RAG prompt is ``[anchor][chunk 1][gap][chunk 2][gap]...[question]``: the anchor is every token before
the first chunk span (the stable prefix and the first chunk's marker), gaps are the later chunks'
markers. A reused chunk's KV is the one it got at its canonical placement: the radix path
``anchor + context + chunk``, where ``context`` is a fixed stand-in for what precedes a chunk that is
not first (the caller's: ``PromptAssembler`` gives a stand-in passage and the second marker; empty:
right after the anchor). So:

* tokens the exact prefix match covers are loaded exactly, as in ``prefix`` mode;
* a chunk that starts right after the anchor is computed exactly (as a prefix: ``anchor + chunk``);
* every other chunk's uncovered tokens are *reused*: taken from the canonical placement, keys rotated
  by ``delta = chunk start - (anchor + context) length`` positions (a ``ReusedRun``; it may be
  negative);
* the rest (gaps, the question, the prompt's last token) is computed.

Everything before ``exact_end`` is exact and only that part of the prompt may be inserted into the
cache: the first reused token, or, where the exact match already covers the first chunk, the end of
that match. The marker between a cached first chunk and the first reused run is then computed with
the stitched tokens: prefilled exactly, its few tokens would take a pass of their own through every
layer (a whole row tile where the Linears run in tiles, engine.row_tiles), and cached it would serve
only prompts that begin with the same chunk.

Example:
    >>> plan = plan_stitch(20, [(4, 8), (9, 14)], cached=0)
    >>> plan.exact_end, [(r.start, r.offset, r.length, r.delta) for r in plan.runs]
    (9, [(9, 0, 5, 5)])
    >>> plan.computed_positions()
    [14, 15, 16, 17, 18, 19]
    >>> plan_stitch(20, [(4, 8), (9, 14)], cached=0, context=[7, 7]).runs[0].delta
    3
    >>> plan_stitch(20, [(4, 8), (9, 14)], cached=8).exact_end  # the marker at 8 joins the computed
    8
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Span = tuple[int, int]


@dataclass(frozen=True)
class ReusedRun:
    """Prompt tokens ``[start, start + length)``: chunk ``chunk``'s tokens from ``offset`` on, shifted
    ``delta`` positions from their canonical placement."""

    chunk: int
    start: int
    offset: int
    length: int
    delta: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class StitchPlan:
    """The reused runs of one prompt (non-empty, in prompt order) and what surrounds them."""

    total: int  # prompt tokens
    anchor: int  # tokens before the first chunk span
    exact_end: int  # [0, exact_end) is loaded or computed exactly (see the module doc)
    runs: tuple[ReusedRun, ...]
    context: tuple[int, ...] = ()  # what stands between the anchor and a chunk at its placement

    @property
    def placement_start(self) -> int:
        """Where a chunk's tokens begin in its canonical placement ``anchor + context + chunk``."""
        return self.anchor + len(self.context)

    @property
    def reused_tokens(self) -> int:
        return sum(r.length for r in self.runs)

    def computed_positions(self) -> list[int]:
        """Positions in ``[exact_end, total)`` no run covers (always computed), ascending."""
        out: list[int] = []
        pos = self.exact_end
        for run in self.runs:
            out.extend(range(pos, run.start))
            pos = run.end
        out.extend(range(pos, self.total))
        return out


def check_spans(spans: Sequence[Sequence[int]], total: int) -> list[Span]:
    """Chunk spans as ``(start, end)`` ints, ascending and disjoint inside a ``total``-token prompt;
    ValueError naming the first bad one."""
    out: list[Span] = []
    previous_end = 0
    for n, span in enumerate(spans):
        if not isinstance(span, (tuple, list)) or len(span) != 2:
            raise ValueError(f"chunk_spans[{n}] must be a (start, end) pair, got {span!r}")
        start, end = span
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (start, end)):
            raise ValueError(f"chunk_spans[{n}] must hold ints, got {span!r}")
        if not previous_end <= start < end <= total:
            raise ValueError(
                f"chunk_spans[{n}] = {tuple(span)} must be non-empty, ascending, disjoint and within "
                f"the prompt's {total} tokens"
            )
        out.append((start, end))
        previous_end = end
    return out


def plan_stitch(
    total: int, spans: Sequence[Span], cached: int, context: Sequence[int] = ()
) -> StitchPlan | None:
    """The plan for a ``total``-token prompt with (checked) ``spans`` whose first ``cached`` tokens the
    exact match covers, its chunks placed after ``anchor + context``; None when nothing is left to
    reuse (then ``prefix`` mode does it all)."""
    if not spans:
        return None
    anchor = spans[0][0]
    placed = anchor + len(context)
    runs = []
    for n, (start, end) in enumerate(spans):
        end = min(end, total - 1)  # the last prompt token is always computed: it gives the logits
        first = max(start, cached)
        if start == anchor or first >= end:
            continue  # canonical placement (exact when computed) or covered by the exact match
        runs.append(ReusedRun(n, first, first - start, end - first, start - placed))
    if not runs:
        return None
    # a cached first chunk: the marker after it is computed with the stitched tokens
    exact_end = cached if cached >= spans[0][1] else runs[0].start
    return StitchPlan(total, anchor, exact_end, tuple(runs), tuple(context))
