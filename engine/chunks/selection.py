"""Which reused chunk tokens a stitched prefill recomputes: the ``Selector`` role and its registry.

A selector reads a ``StitchContext`` (the prompt, its plan, the policy, the buffer holding the
stitched KV, and the runner's blocks through ``StitchedPrefill``) and returns a ``Selection``: the
hidden states the main pass starts from, at which layer, for which positions. Positional selectors
choose before any compute and start at layer 0; ``deviation`` and ``query`` run a first pass up to
``select_layer`` and choose from what it shows. Strategies are looked up by name
(``ChunkReuse.strategy``); adding one is a class with ``@register("name")`` and a name in
``engine.chunks.reuse.RecomputeStrategy``.

Example:
    >>> sorted(SELECTORS) == sorted(STRATEGIES)                  # doctest: +SKIP
    True
    >>> selection = selector("first").select(context)             # doctest: +SKIP
    >>> selection.layer, selection.picks[:3]                       # doctest: +SKIP
    (0, [61, 62, 63])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from engine.chunks.plan import StitchPlan
from engine.chunks.reuse import STRATEGIES, ChunkReuse
from engine.kv.state import KVBuffer

if TYPE_CHECKING:
    from engine.chunks.stitch import StitchedPrefill


@dataclass(frozen=True)
class StitchContext:
    """What a selector may read. ``always``: positions computed whatever the selection (gaps, the
    question, the last prompt token), ascending."""

    prefill: StitchedPrefill
    buffer: KVBuffer
    prompt_ids: Sequence[int]
    plan: StitchPlan
    policy: ChunkReuse
    always: torch.Tensor

    @property
    def reused(self) -> torch.Tensor:
        """Every reused position (the runs' tokens), ascending."""
        return torch.tensor(
            [p for run in self.plan.runs for p in range(run.start, run.end)], dtype=torch.long
        )

    @property
    def layer(self) -> int:
        """The layer a layered selector looks at (``select_layer``, within the model)."""
        return min(self.policy.select_layer, self.prefill.runner.num_layers - 1)

    def budget(self, reused: int) -> int:
        """Reused tokens a shared budget allows: ``share`` of them, rounded down (never over)."""
        return min(int(self.policy.share * reused), reused)


@dataclass
class Selection:
    """The main pass starts at ``layer`` with hidden states ``x`` of ``positions`` (ascending: the
    always-computed ones and ``picks``, the reused positions recomputed)."""

    x: torch.Tensor
    positions: torch.Tensor
    layer: int
    picks: list[int]


class Selector(Protocol):
    """Chooses the reused tokens to recompute and where the main pass starts."""

    def select(self, ctx: StitchContext) -> Selection: ...


SELECTORS: dict[str, Selector] = {}
S = TypeVar("S")


def register(name: str) -> Callable[[type[S]], type[S]]:
    """Class decorator: make an instance of the class the selector of strategy ``name``."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r} is not declared in engine.chunks.reuse.RecomputeStrategy")

    def add(cls: type[S]) -> type[S]:
        SELECTORS[name] = cls()  # type: ignore[assignment]
        return cls

    return add


def selector(name: str) -> Selector:
    """The selector of strategy ``name`` (ValueError naming the registered ones)."""
    _load()
    try:
        return SELECTORS[name]
    except KeyError:
        raise ValueError(
            f"no selector for strategy {name!r}; registered: {', '.join(sorted(SELECTORS))}"
        ) from None


def from_layer_zero(ctx: StitchContext, picks: Sequence[int]) -> Selection:
    """The main pass over the always-computed positions and ``picks``, from the embeddings."""
    positions = torch.tensor(sorted({*ctx.always.tolist(), *picks}), dtype=torch.long)
    return Selection(ctx.prefill.embed(ctx.prompt_ids, positions), positions, 0, sorted(picks))


def _load() -> None:
    """Import the modules that register the built-in selectors."""
    from engine.chunks import deviation, positional, query  # noqa: F401
