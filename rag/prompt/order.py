"""Chunk-order policies and the context budget for `rag.prompt.assembler.PromptAssembler`.

Chunks arrive ranked by relevance (index 0 is best). A policy returns a permutation of those indices:

- ``relevance``: as given, best first.
- ``canonical``: sorted by ``(doc_id, chunk_id)``, so the same set of chunks gives the same token ids
  whatever their ranks, and a repeated set hits the prefix cache.
- ``cache``: RAGCache-style greedy search: at each position take the remaining chunk that extends the
  prefix the engine's cache already holds the furthest (ties go to the better rank); once none extends
  it, the rest follow in relevance order. Needs a ``prefix_probe``; without one it is ``canonical``.
  (A relevance tail rather than a canonical one: later questions on a topic share its best chunk
  more often than its whole chunk set; docs/benchmarks/report.md compares the orders.)

Example:
    >>> fit_count(base=100, chunk_lengths=[50, 50, 50], budget=210)
    2
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol, get_args

ChunkOrder = Literal["relevance", "canonical", "cache"]
ORDERS: tuple[str, ...] = get_args(ChunkOrder)
# chunks mode reuses every cached chunk wherever it stands, so its order is the one answers are best in
CHUNKS_MODE_ORDER = "relevance"

PrefixProbe = Callable[[list[int]], int]
"""Given candidate prompt ids, how many leading tokens the cache holds (must not change the cache)."""


class ChunkLike(Protocol):
    """What the assembler needs from a retrieved chunk (`rag` retrieval's ScoredChunk satisfies it)."""

    @property
    def doc_id(self) -> str: ...
    @property
    def chunk_id(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def score(self) -> float: ...


def canonical_key(chunk: ChunkLike) -> tuple[str, str]:
    return (str(chunk.doc_id), str(chunk.chunk_id))


def fit_count(base: int, chunk_lengths: Sequence[int], budget: int) -> int:
    """How many leading (best-ranked) chunks fit next to ``base`` tokens within ``budget``."""
    total = base
    for n, length in enumerate(chunk_lengths):
        total += length
        if total > budget:
            return n
    return len(chunk_lengths)


def canonical_order(chunks: Sequence[ChunkLike]) -> list[int]:
    return sorted(range(len(chunks)), key=lambda i: canonical_key(chunks[i]))


def cache_order(
    prefix: list[int],
    chunks: Sequence[ChunkLike],
    ids_at: Callable[[int, int], list[int]],
    probe: PrefixProbe,
) -> list[int]:
    """Greedy cache-aware order; ``ids_at(i, pos)`` is chunk i's ids when placed at position ``pos``.

    Costs at most k*(k+1)/2 probes for k chunks, fewer as soon as the cached prefix stops growing.
    """
    ids = list(prefix)
    remaining = list(range(len(chunks)))  # kept in rank order: strict '>' below breaks ties by rank
    chosen: list[int] = []
    while len(remaining) > 1:  # a last candidate needs no probe
        pos = len(chosen)
        best, best_hit, best_ids = -1, len(ids), list[int]()
        for i in remaining:
            cand = ids_at(i, pos)
            hit = min(probe(ids + cand), len(ids) + len(cand))
            if hit > best_hit:
                best, best_hit, best_ids = i, hit, cand
        # only a shared position marker ("[2]") cached is no real extension
        if best < 0 or best_hit <= len(ids) + _shared_head(ids_at, remaining, pos):
            break
        chosen.append(best)
        remaining.remove(best)
        ids += best_ids
        if best_hit < len(ids):  # the chosen chunk is only partly cached: nothing after it can be
            break
    return chosen + remaining  # remaining is still in rank order


def _shared_head(ids_at: Callable[[int, int], list[int]], remaining: list[int], pos: int) -> int:
    """Length of the ids every remaining candidate starts with at this position (its marker)."""
    first = ids_at(remaining[0], pos)
    n = len(first)
    for i in remaining[1:]:
        other = ids_at(i, pos)
        n = next((j for j in range(min(n, len(other))) if other[j] != first[j]), min(n, len(other)))
    return n


def order_indices(
    order: str,
    chunks: Sequence[ChunkLike],
    prefix: list[int],
    ids_at: Callable[[int, int], list[int]],
    probe: PrefixProbe | None,
) -> list[int]:
    """Dispatch on the policy name (validated by the assembler)."""
    if order == "relevance":
        return list(range(len(chunks)))
    if order == "cache" and probe is not None and chunks:
        return cache_order(prefix, chunks, ids_at, probe)
    return canonical_order(chunks)
