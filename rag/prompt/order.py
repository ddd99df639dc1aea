"""Chunk-order policies and the context budget for `rag.prompt.assembler.PromptAssembler`.

Chunks arrive ranked by relevance (index 0 is best). A policy returns a permutation of those indices:

- ``relevance``: as given, best first.
- ``canonical``: sorted by ``(doc_id, chunk_id)``, so the same set of chunks gives the same token ids
  whatever their ranks, and a repeated set hits the prefix cache.
- ``cache``: the best-ranked chunk where the model reads a chunk best (``BEST_CHUNK_AT``), whatever
  the cache holds; the others in a RAGCache-style greedy order: at each position the best-ranked
  remaining chunk the engine's cache holds whole after what precedes it (so when every placement is
  cached alike, as after warming, relevance order stands), else the one it holds furthest; once none
  extends the cached prefix, the rest follow in relevance order (later questions on a topic share its
  best chunk more often than its whole chunk set). Without a ``prefix_probe`` the others are in
  canonical order. docs/benchmarks/report.md compares the orders' hit rates and answers.

Example:
    >>> fit_count(base=100, chunk_lengths=[50, 50, 50], budget=210)
    2
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol, get_args

ChunkOrder = Literal["relevance", "canonical", "cache"]
ORDERS: tuple[str, ...] = get_args(ChunkOrder)
ReadPosition = Literal["first", "last"]
# Where this model reads a retrieved chunk best (first after the system prompt, or last, next to the
# question): the answer-quality section's full-prefill accuracy by the fact's chunk position. The
# ``cache`` order keeps the best-ranked chunk there whatever the cache holds.
BEST_CHUNK_AT: ReadPosition = "first"
# chunks mode reuses every cached chunk wherever it stands, so its order is the one answers are best in
CHUNKS_MODE_ORDER: ChunkOrder = "relevance"

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
    best_at: ReadPosition = BEST_CHUNK_AT,
) -> list[int]:
    """The best-ranked chunk at ``best_at`` whatever the cache holds; the others in the greedy
    cache-aware order (``ids_at(i, pos)``: chunk i's ids when placed at position ``pos``).

    Costs at most k*(k-1)/2 probes for k chunks, fewer as soon as the cached prefix stops growing.
    """
    if len(chunks) <= 1:
        return list(range(len(chunks)))
    rest = list(range(1, len(chunks)))
    if best_at == "first":
        return [0, *_greedy([*prefix, *ids_at(0, 0)], rest, 1, ids_at, probe)]
    return [*_greedy(list(prefix), rest, 0, ids_at, probe), 0]


def _greedy(
    ids: list[int],
    remaining: list[int],
    first_pos: int,
    ids_at: Callable[[int, int], list[int]],
    probe: PrefixProbe,
) -> list[int]:
    """At each position from ``first_pos``: the best-ranked remaining chunk the cache holds whole
    after ``ids`` (a tie keeps relevance order), else the one it holds furthest (nothing can be cached
    after a partly cached chunk); once none extends the cached prefix, the rest in rank order."""
    ids = list(ids)
    remaining = list(remaining)  # kept in rank order
    chosen: list[int] = []
    while len(remaining) > 1:  # a last candidate needs no probe
        pos = first_pos + len(chosen)
        best, best_hit, best_ids, whole = -1, len(ids), list[int](), False
        for i in remaining:
            cand = ids_at(i, pos)
            hit = min(probe(ids + cand), len(ids) + len(cand))
            if hit == len(ids) + len(cand):  # cached whole: the best rank of those wins
                best, best_hit, best_ids, whole = i, hit, cand, True
                break
            if hit > best_hit:
                best, best_hit, best_ids = i, hit, cand
        # only a shared position marker ("[2]") cached is no real extension
        if best < 0 or best_hit <= len(ids) + _shared_head(ids_at, remaining, pos):
            break
        chosen.append(best)
        remaining.remove(best)
        ids += best_ids
        if not whole:
            break
    return chosen + remaining


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
    if order == "canonical" or not chunks:
        return canonical_order(chunks)
    if probe is not None:
        return cache_order(prefix, chunks, ids_at, probe)
    return pin_best(canonical_order(chunks[1:]), BEST_CHUNK_AT)


def pin_best(rest: list[int], best_at: ReadPosition) -> list[int]:
    """``rest`` (a permutation of the chunks ranked after the best, counted from 0 for the second)
    with the best-ranked chunk, 0, at ``best_at``."""
    shifted = [i + 1 for i in rest]
    return [0, *shifted] if best_at == "first" else [*shifted, 0]
