"""Retrievers and rerankers built from a ``RAGConfig``: the one place that maps config names to components.

Example:
    >>> retriever = make_retriever(cfg, embedder, index, bm25, chunks, mode="hybrid")  # doctest: +SKIP
    >>> reranker = make_reranker(cfg, embedder, chunker)                              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.ingestion.chunking import Chunker
from rag.ingestion.documents import Chunk
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.embedder import Embedder
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import CrossEncoderReranker, EmbeddingReranker, NoReranker, Reranker
from rag.retrieval.retriever import BM25Retriever, DenseRetriever, HybridRetriever, Retriever


def make_retriever(
    config: RAGConfig,
    embedder: Embedder,
    index: VectorIndex | FederatedIndex,
    bm25: BM25Index | FederatedBM25,
    chunks: Mapping[str, Chunk],
    *,
    mode: RetrievalMode | None = None,
    fusion: Fusion | None = None,
) -> Retriever:
    """The first-stage retriever for ``mode`` (default: the config's); ``fusion`` overrides the
    config's for hybrid mode."""
    mode = mode or config.retrieval_mode
    dense = DenseRetriever(embedder, index, chunks)
    lexical = BM25Retriever(bm25, chunks)
    if mode == "dense":
        return dense
    if mode == "bm25":
        return lexical
    if mode == "hybrid":
        return HybridRetriever(
            dense, lexical, fusion or config.fusion, config.dense_weight, config.rrf_k, config.fusion_pool
        )
    raise ValueError(f"mode must be 'dense', 'bm25' or 'hybrid', got {mode!r}")


def make_reranker(config: RAGConfig, embedder: Embedder, chunker: Chunker) -> Reranker:
    """The reranker the config names (``reranker``: none, embedding or cross-encoder)."""
    if config.reranker == "embedding":
        return EmbeddingReranker(embedder, chunker, weight=config.rerank_weight)
    if config.reranker == "cross-encoder":
        assert config.reranker_model is not None  # checked by RAGConfig
        return CrossEncoderReranker(config.reranker_model)
    return NoReranker()
