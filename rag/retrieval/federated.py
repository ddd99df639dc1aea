"""Search over several collections at once: the read side of VectorIndex and BM25Index over a few
disjoint indexes, so the usual retrievers (dense, BM25, hybrid) run unchanged across collections.

Each index is searched for the full ``k`` and the hits are merged by score. Dense scores are cosines
and compare across indexes as they are, so the merge returns exactly the top ``k`` a single exact
index over the union would (HNSW collections: each as good as its own graph). BM25 scores come from
each collection's own statistics: no collection's term frequencies influence another's ranking.
Keys (chunk ids) are unique across collections, which the chunk ids' collection scoping guarantees.

Example:
    >>> dense = DenseRetriever(embedder, FederatedIndex([alice.index, shared.index]), chunks)  # doctest: +SKIP
    >>> lexical = BM25Retriever(FederatedBM25([alice.bm25, shared.bm25]), chunks)            # doctest: +SKIP
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import chain

import numpy as np

from rag.retrieval.bm25 import BM25Index
from rag.retrieval.index import VectorIndex


def _top(hits: list[tuple[str, float]], k: int) -> list[tuple[str, float]]:
    """The ``k`` best (key, score) pairs, best first; ties keep index order (a stable merge)."""
    ranked = heapq.nsmallest(k, enumerate(hits), key=lambda item: (-item[1][1], item[0]))
    return [hit for _, hit in ranked]


class FederatedIndex:
    """``VectorIndex``'s search side over several indexes (the KnowledgeBase's selected collections).

    Example:
        >>> a, b = VectorIndex(2, kind="flat"), VectorIndex(2, kind="flat")
        >>> a.add(["x"], np.array([[1, 0]], dtype=np.float32)); b.add(["y"], np.array([[0, 1]], dtype=np.float32))
        >>> FederatedIndex([a, b]).search(np.array([0.2, 0.8], dtype=np.float32), k=1)
        [('y', 0.800000011920929)]
    """

    def __init__(self, indexes: Sequence[VectorIndex]) -> None:
        self.indexes = list(indexes)

    def __len__(self) -> int:
        return sum(len(index) for index in self.indexes)

    def __contains__(self, key: object) -> bool:
        return any(key in index for index in self.indexes)

    def keys(self) -> list[str]:
        return list(chain.from_iterable(index.keys() for index in self.indexes))

    def search(self, query: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The ``k`` best keys over every index, as (key, inner product), best first."""
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        return _top([hit for index in self.indexes if len(index) for hit in index.search(query, k)], k)

    def best_scores(self, query: np.ndarray, keys: Sequence[str]) -> dict[str, float]:
        """Exact inner product of ``query`` with each known key's best vector, over every index."""
        scores: dict[str, float] = {}
        for index in self.indexes:
            scores.update(index.best_scores(query, [key for key in keys if key in index]))
        return scores

    def vectors_of(self, key: str) -> np.ndarray:
        for index in self.indexes:
            if key in index:
                return index.vectors_of(key)
        return np.zeros((0, self.indexes[0].dim if self.indexes else 0), dtype=np.float32)


class FederatedBM25:
    """``BM25Index``'s search side over several indexes, each scoring with its own statistics.

    Example:
        >>> a, b = BM25Index(), BM25Index()
        >>> a.add(["x"], ["the cat sat"]); b.add(["y"], ["a dog ran"])
        >>> [key for key, _ in FederatedBM25([a, b]).search("dog", k=2)]
        ['y']
    """

    def __init__(self, indexes: Sequence[BM25Index]) -> None:
        self.indexes = list(indexes)

    def __len__(self) -> int:
        return sum(len(index) for index in self.indexes)

    def __contains__(self, key: object) -> bool:
        return any(key in index for index in self.indexes)

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        return _top([hit for index in self.indexes if len(index) for hit in index.search(query, k)], k)

    def score(self, query: str, keys: Sequence[str]) -> dict[str, float]:
        """BM25 score of each known key, from the index that holds it (0.0 when no term occurs)."""
        scores: dict[str, float] = {}
        for index in self.indexes:
            scores.update(index.score(query, [key for key in keys if key in index]))
        return scores
