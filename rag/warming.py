"""Warming: prefill every indexed chunk at its placements before anyone asks.

A chunk has two: what a prompt with that chunk first starts with (the stable prefix, the ``[1]``
marker and the chunk's body, ``PromptAssembler.placement``), which any request with the chunk first
reuses exactly, and the one its KV is stitched from wherever it stands later (the same after a
stand-in passage and ``[2]``, ``PromptAssembler.stitch_placement``). With both cached, a
``chunks``-mode request reuses every chunk, even on the first question of a topic. Each placement is
an ordinary one-token request to the engine, so it goes through the engine's normal insert (and
whatever tiers the cache has); the stand-in passage is prefilled once and shared by every chunk.

Warming is resumable (placements already cached are skipped), cancellable (between chunks) and stays
within the cache's budget: once the next placement would make the cache evict, the rest is reported
as not fitted instead of pushing out what was warmed.

Example:
    >>> report = warm_chunks(engine, assembler, chunks, namespace="", show_progress=True)  # doctest: +SKIP
    >>> report.warmed, report.already_cached, len(report.not_fitted)                          # doctest: +SKIP
    (602, 0, 0)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.backend import GenerationBackend, cache_probe, local_cache
from engine.sampling import SamplingParams
from rag.prompt.assembler import PromptAssembler
from rag.prompt.order import ChunkLike

Progress = Callable[[int, int], None]
"""(chunks done, chunks in all) after each chunk."""


@dataclass
class WarmReport:
    """What a warm-up did. ``not_fitted``: chunk ids left out because the cache budget was full."""

    chunks: int = 0
    warmed: int = 0
    already_cached: int = 0
    not_fitted: list[str] = field(default_factory=list)
    tokens: int = 0  # tokens prefilled
    seconds: float = 0.0
    cancelled: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "warmed": self.warmed,
            "already_cached": self.already_cached,
            "not_fitted": len(self.not_fitted),
            "not_fitted_chunk_ids": self.not_fitted[:100],
            "tokens": self.tokens,
            "seconds": self.seconds,
            "cancelled": self.cancelled,
        }


def warm_chunks(
    engine: GenerationBackend,
    assembler: PromptAssembler,
    chunks: Sequence[ChunkLike],
    namespace: str = "",
    *,
    show_progress: bool = False,
    cancel: threading.Event | None = None,
    progress: Progress | None = None,
) -> WarmReport:
    """Prefill each chunk's placements into ``engine``'s cache (``engine.generate``; the stitch
    placement only where ``capabilities.chunk_reuse``). A backend with ``capabilities.prefix_probe`` (a local Engine) makes it resumable and bounded by the cache budget;
    with ``local_cache`` it returns once the tiers under RAM hold the placements too."""
    report = WarmReport(chunks=len(chunks))
    started = time.perf_counter()
    probe = cache_probe(engine)
    one_token = SamplingParams(max_tokens=1)
    stitching = engine.capabilities.chunk_reuse  # else only the exact placement is ever reused
    with _bar(show_progress, len(chunks)) as advance:
        for n, chunk in enumerate(chunks):
            if cancel is not None and cancel.is_set():
                report.cancelled = True
                break
            placements = [assembler.placement(chunk)]
            if stitching:
                placements.append(assembler.stitch_placement(chunk))
            cached_now = [(ids, _cached(probe, ids, namespace)) for ids in placements]
            missing = [(ids, cached) for ids, cached in cached_now if cached < len(ids)]
            needed = sum(len(ids) - cached for ids, cached in missing)
            if not missing:
                report.already_cached += 1
            elif report.not_fitted or (probe is not None and probe.free_cache_tokens() < needed):
                report.not_fitted.append(str(chunk.chunk_id))  # the budget is full: no evicting
            else:
                for ids, _ in missing:
                    engine.generate(ids, one_token, namespace=namespace, reuse="prefix")
                report.warmed += 1
                report.tokens += needed
            advance()
            if progress is not None:
                progress(n + 1, len(chunks))
    cache = local_cache(engine)
    if (
        cache is not None
    ):  # the placements are in the tiers under RAM (for a restart, for replicas) before this returns
        cache.flush_tiers()
    report.seconds = time.perf_counter() - started
    return report


def _cached(probe: Any, ids: list[int], namespace: str) -> int:
    """Tokens of ``ids`` the backend's cache holds (0 where it cannot tell)."""
    return probe.cached_prefix_length(ids, namespace) if probe is not None else 0


@contextmanager
def _bar(show: bool, total: int) -> Iterator[Callable[[], None]]:
    if not show:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("warming chunks"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("warm", total=total)
        yield lambda: bar.update(task, advance=1)
