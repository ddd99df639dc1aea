"""How a request reuses cached KV: ``prefix`` (exact) or ``chunks`` (approximate, opt-in), and whether a
model can do ``chunks`` at all.

``prefix`` reuses the longest cached prefix of the prompt, nothing else: output equals full prefill.
``chunks`` also reuses every retrieved chunk the cache has seen after the stable prefix, wherever the
chunk stands now (keys re-rotated to the new position), and recomputes a share of the reused chunk
tokens so the chunks see each other (``engine.chunks.stitch``; which ones: ``engine.chunks.selection``). Its fidelity to full prefill is measured in
the benchmark, never assumed.

Example:
    >>> ChunkReuse(strategy="first", share=0.1).share
    0.1
    >>> resolve_reuse("chunks", ChunkReuse()).strategy
    'first_tail'
    >>> resolve_reuse("prefix", ChunkReuse()) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from engine.runners import Runner

ReuseMode = Literal["prefix", "chunks"]
# each name is a selector in engine.chunks.selection's registry (a test holds the two in step)
RecomputeStrategy = Literal["none", "boundary", "first", "edges", "tail", "first_tail", "deviation", "query"]
REUSE_MODES: tuple[str, ...] = get_args(ReuseMode)
STRATEGIES: tuple[str, ...] = get_args(RecomputeStrategy)
# strategies whose budget is ``share``; ``none`` and ``boundary`` recompute a fixed set
SHARED_STRATEGIES = frozenset({"first", "edges", "tail", "first_tail", "deviation", "query"})
# strategies that select by looking at ``select_layer``
LAYERED_STRATEGIES = frozenset({"deviation", "query"})

# the QA set's choice (docs/benchmarks/quality/: amd-epyc-zen5/report.md, stand_in.md)
DEFAULT_STRATEGY: RecomputeStrategy = "first_tail"
DEFAULT_SHARE = 0.2
DEFAULT_SELECT_LAYER = 1
# RoPE variants whose rotation by p then by d equals the rotation by p + d (position-linear angles,
# cos/sin not rescaled): dynamic NTK changes its frequencies with the length, yarn/longrope rescale
ROTATABLE_ROPE = frozenset({"default", "linear", "llama3"})


@dataclass(frozen=True)
class ChunkReuse:
    """Recompute settings of a ``chunks``-mode request.

    ``strategy`` (each a selector of ``engine.chunks.selection``): ``none`` (the naive stitch),
    ``boundary`` (one token per reused chunk: its first, where it meets what precedes it), ``first``
    (the first ``share`` of every reused chunk's tokens: each chunk's own attention sink), ``edges``
    (its first and last tokens, ``share`` split between them), ``tail`` (the ``share`` of reused tokens
    nearest the question, counted back from the last chunk's end), ``first_tail`` (half the ``share``
    as ``first``, the rest as ``tail``), ``deviation`` (CacheBlend: the ``share`` of reused tokens
    whose keys/values deviate most from a fresh computation at ``select_layer``; the layers below it
    are recomputed for every chunk token), ``query`` (ProphetKV-style: the ``share`` of reused tokens
    the question attends to most at ``select_layer``). The question, chunk markers and anything not
    cached are always computed.

    Example:
        >>> ChunkReuse(strategy="query", share=0.2, select_layer=2)
        ChunkReuse(strategy='query', share=0.2, select_layer=2)
    """

    strategy: RecomputeStrategy = DEFAULT_STRATEGY
    share: float = DEFAULT_SHARE
    select_layer: int = DEFAULT_SELECT_LAYER

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"recompute strategy {self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if (
            isinstance(self.share, bool)
            or not isinstance(self.share, (int, float))
            or not 0 <= self.share <= 1
        ):
            raise ValueError(f"recompute share must be a number in [0, 1], got {self.share!r}")
        if isinstance(self.select_layer, bool) or not isinstance(self.select_layer, int):
            raise ValueError(f"select_layer must be an int >= 1, got {self.select_layer!r}")
        if self.select_layer < 1:
            raise ValueError(
                f"select_layer must be >= 1 (layer 0 sees no other chunk), got {self.select_layer}"
            )

    @property
    def label(self) -> str:
        """Short name for reports: ``none``, ``boundary``, ``first 10%``, ``deviation 15% @1``."""
        budget = f" {self.share:.0%}" if self.strategy in SHARED_STRATEGIES else ""
        at = f" @{self.select_layer}" if self.strategy in LAYERED_STRATEGIES else ""
        return f"{self.strategy}{budget}{at}"


def resolve_reuse(requested: str | ChunkReuse | None, default: ChunkReuse | None) -> ChunkReuse | None:
    """A request's chunk settings (None: prefix mode) from its ``reuse`` option and the engine default.

    ``requested``: None (the engine's mode), ``"prefix"``, ``"chunks"`` (the engine's recompute settings)
    or a ``ChunkReuse``. ``default``: the engine's settings when its mode is ``chunks``, else None.
    """
    if requested is None:
        return default
    if isinstance(requested, ChunkReuse):
        return requested
    if requested == "prefix":
        return None
    if requested == "chunks":
        return default or ChunkReuse()
    raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)} or a ChunkReuse, got {requested!r}")


def chunks_unsupported_reason(runner: Runner, caching: bool) -> str | None:
    """Why ``chunks`` mode cannot run on this engine (None: it can)."""
    if not caching:
        return "prefix caching is off (nothing to reuse)"
    return runner.capabilities.stitch_blocker


def rotation_blocker(rotary: Any) -> str | None:
    """Why re-rotating a cached key with this rotary embedding would not equal computing it at the new
    position (None: RoPE is a plain rotation, so chunk stitching can move keys)."""
    rope_type = getattr(rotary, "rope_type", None)
    if rope_type not in ROTATABLE_ROPE:
        return f"rope type {rope_type!r} is not a plain rotation (allowed: {sorted(ROTATABLE_ROPE)})"
    if float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        return "the rotary embedding rescales cos/sin, so a re-rotated key would be scaled twice"
    return None
