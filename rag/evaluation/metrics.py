"""Retrieval metrics over labelled questions: recall@k, MRR, by-document coverage, bootstrap intervals.

A question's hits are ranked chunks; a hit is relevant when its document's topic is one of the
question's topics. ``first_relevant_rank`` is the 1-based rank of the first relevant hit (None if
there is none), from which recall@k (the share of questions with that rank <= k) and MRR (the mean
of 1/rank, 0 for none) follow. Intervals are percentile bootstraps over questions.

Example:
    >>> ranks = [1, 3, None, 2]
    >>> recall_at_k(ranks, 1), recall_at_k(ranks, 4), round(mean_reciprocal_rank(ranks), 3)
    (0.25, 0.75, 0.458)
    >>> lo, hi = bootstrap_interval([1.0, 0.0, 1.0, 1.0], resamples=200)
    >>> 0.0 <= lo <= 0.75 <= hi <= 1.0
    True
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from rag.types import ScoredChunk

DEFAULT_RESAMPLES = 2000


def hit_topic(hit: ScoredChunk) -> str:
    """The corpus topic a hit comes from (``metadata["topic"]``, else its document id)."""
    return str(hit.metadata.get("topic", hit.doc_id))


def first_relevant_rank(hits: Sequence[ScoredChunk], topics: Collection[str]) -> int | None:
    """1-based rank of the first hit from a relevant topic, or None."""
    return next((rank for rank, hit in enumerate(hits, 1) if hit_topic(hit) in topics), None)


def recall_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Share of questions whose first relevant hit is within the top ``k``."""
    _check_nonempty(ranks)
    return sum(r is not None and r <= k for r in ranks) / len(ranks)


def mean_reciprocal_rank(ranks: Sequence[int | None]) -> float:
    """Mean of 1/rank of the first relevant hit (0 when there is none in the list)."""
    _check_nonempty(ranks)
    return sum(1.0 / r for r in ranks if r is not None) / len(ranks)


def document_coverage(hits: Sequence[ScoredChunk], topics: Collection[str], k: int) -> float:
    """Share of the relevant topics that appear in the top ``k``, out of as many as ``k`` can hold."""
    found = {hit_topic(h) for h in hits[:k]} & set(topics)
    return len(found) / min(k, len(topics))


def distinct_documents(hits: Sequence[ScoredChunk], k: int) -> int:
    """How many different documents the top ``k`` hits come from."""
    return len({h.doc_id for h in hits[:k]})


def bootstrap_interval(
    values: Sequence[float], *, resamples: int = DEFAULT_RESAMPLES, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-question ``values``."""
    _check_nonempty(values)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    data = np.asarray(values, dtype=np.float64)  # [n]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(data), size=(resamples, len(data)))  # [resamples, n]
    means = data[picks].mean(axis=1)
    tail = 100 * (1.0 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def _check_nonempty(values: Sequence[object]) -> None:
    if len(values) == 0:
        raise ValueError("no questions to score (empty list)")
