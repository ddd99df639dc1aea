"""First-stage retrieval: dense (FAISS), lexical (BM25) and their fusion, all returning ScoredChunks.

Every retriever has ``retrieve(query, top_k) -> list[ScoredChunk]``, best first, which checks its
arguments, and ``search(Query)``, which takes a query checked already (``rag.query``: what the
knowledge base and the retrievers wrapping others call, so nothing is checked twice). ``HybridRetriever``
pools the top ``pool`` candidates of each side, completes the missing side's score for every pooled
chunk (exact cosine from the stored vectors, exact BM25), and fuses either by a weighted sum of
min-max-normalised scores (``"weighted"``, the measured default) or by reciprocal rank (``"rrf"``).

Example:
    >>> hybrid = make_retriever(RAGConfig(), embedder, index, bm25, chunks, mode="hybrid")  # doctest: +SKIP
    >>> [hit.doc_id for hit in hybrid.retrieve("how do I catch two exceptions?", top_k=2)]        # doctest: +SKIP
    ['try', 'compound']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from rag.query import Query
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.index import VectorIndex
from rag.types import Chunk, ScoredChunk


@runtime_checkable
class Retriever(Protocol):
    """Anything that turns a query into scored chunks, best first."""

    def retrieve(self, query: str, top_k: int) -> list[ScoredChunk]: ...


@runtime_checkable
class QueryRetriever(Retriever, Protocol):
    """A retriever that also takes a checked ``Query`` (every retriever here is one)."""

    def search(self, query: Query) -> list[ScoredChunk]: ...


class QueryEmbedder(Protocol):
    """What dense retrieval needs from an embedder (``rag.retrieval.embedder.Embedder`` is one)."""

    def embed_query(self, text: str) -> np.ndarray: ...


def _hits(pairs: Sequence[tuple[str, float]], chunks: Mapping[str, Chunk]) -> list[ScoredChunk]:
    return [ScoredChunk.of(chunks[key], score) for key, score in pairs if key in chunks]


class DenseRetriever:
    """Cosine similarity between the query embedding and chunk embeddings (FAISS).

    Example:
        >>> dense = DenseRetriever(embedder, index, chunks)       # doctest: +SKIP
        >>> dense.retrieve("what does pass do?", top_k=1)[0].doc_id  # doctest: +SKIP
        'pass'
    """

    def __init__(
        self, embedder: QueryEmbedder, index: VectorIndex | FederatedIndex, chunks: Mapping[str, Chunk]
    ) -> None:
        self.embedder, self.index, self.chunks = embedder, index, chunks

    def embed_query(self, query: str) -> np.ndarray:
        """The query's unit vector (the embedder keeps recent ones: hybrid retrieval and the sources'
        scores ask for the same question)."""
        return self.embedder.embed_query(query)

    def retrieve(self, query: str, top_k: int) -> list[ScoredChunk]:
        return self.search(Query.of(query, top_k))

    def search(self, query: Query) -> list[ScoredChunk]:
        if not len(self.index):
            return []
        return _hits(self.index.search(self.embed_query(query.text), query.top_k), self.chunks)

    def score(self, query: str, chunk_ids: Sequence[str]) -> dict[str, float]:
        """Exact cosine of the query with each chunk (its best vector)."""
        return self.index.best_scores(self.embed_query(query), chunk_ids)


class BM25Retriever:
    """Lexical BM25 over the chunk texts (bm25s).

    Example:
        >>> BM25Retriever(bm25, chunks).retrieve("__slots__", top_k=1)[0].doc_id  # doctest: +SKIP
        'attribute-access'
    """

    def __init__(self, bm25: BM25Index | FederatedBM25, chunks: Mapping[str, Chunk]) -> None:
        self.bm25, self.chunks = bm25, chunks

    def retrieve(self, query: str, top_k: int) -> list[ScoredChunk]:
        return self.search(Query.of(query, top_k))

    def search(self, query: Query) -> list[ScoredChunk]:
        return _hits(self.bm25.search(query.text, query.top_k), self.chunks)

    def score(self, query: str, chunk_ids: Sequence[str]) -> dict[str, float]:
        """BM25 score of each chunk (0 for chunks sharing no term with the query)."""
        return self.bm25.score(query, chunk_ids)


def weighted_fusion(score_maps: Sequence[Mapping[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """Sum of ``weight * min-max-normalised score`` over the maps; a key missing from a map gets 0 there."""
    fused: dict[str, float] = {}
    for scores, weight in zip(score_maps, weights, strict=True):
        if not scores:
            continue
        lo, hi = min(scores.values()), max(scores.values())
        span = hi - lo if hi > lo else 1.0
        for key, s in scores.items():
            fused[key] = fused.get(key, 0.0) + weight * (s - lo) / span
    return fused


def rrf_fusion(rankings: Sequence[Sequence[str]], weights: Sequence[float], k: int) -> dict[str, float]:
    """Reciprocal rank fusion: ``sum(weight / (k + rank))`` with ranks from 1."""
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
    return fused


class HybridRetriever:
    """Dense + BM25, fused by weighted normalised scores or reciprocal rank fusion. The fusion settings
    have no defaults here: ``RAGConfig`` owns them (``rag.retrieval.factory`` passes its values).

    Example:
        >>> hybrid = HybridRetriever(dense, lexical, fusion="weighted", dense_weight=0.7, rrf_k=60, pool=50)  # doctest: +SKIP
        >>> hybrid.retrieve("how do I merge two dicts?", top_k=4)                          # doctest: +SKIP
    """

    def __init__(
        self,
        dense: DenseRetriever,
        lexical: BM25Retriever,
        *,
        fusion: Literal["weighted", "rrf"],
        dense_weight: float,
        rrf_k: int,
        pool: int,
    ) -> None:
        if fusion not in ("weighted", "rrf"):
            raise ValueError(f"fusion must be 'weighted' or 'rrf', got {fusion!r}")
        if not 0.0 <= dense_weight <= 1.0:
            raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
        if pool <= 0 or rrf_k <= 0:
            raise ValueError(f"pool and rrf_k must be > 0, got pool={pool}, rrf_k={rrf_k}")
        self.dense, self.lexical = dense, lexical
        self.fusion, self.dense_weight, self.rrf_k, self.pool = fusion, dense_weight, rrf_k, pool

    def retrieve(self, query: str, top_k: int) -> list[ScoredChunk]:
        return self.search(Query.of(query, top_k))

    def search(self, query: Query) -> list[ScoredChunk]:
        pooled_query = query.deeper(max(self.pool, query.top_k))
        dense_hits = self.dense.search(pooled_query)
        lexical_hits = self.lexical.search(pooled_query)
        weights = (self.dense_weight, 1.0 - self.dense_weight)
        if self.fusion == "rrf":
            rankings = [[h.chunk_id for h in dense_hits], [h.chunk_id for h in lexical_hits]]
            fused = rrf_fusion(rankings, weights, self.rrf_k)
        else:
            pooled = list(dict.fromkeys(h.chunk_id for h in [*dense_hits, *lexical_hits]))
            fused = weighted_fusion(
                [self.dense.score(query.text, pooled), self.lexical.score(query.text, pooled)], weights
            )
        best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[: query.top_k]
        return _hits(best, self.dense.chunks)
