"""Embedders, retrievers and rerankers built from a ``RAGConfig``: the one place that maps config
names to components.

Example:
    >>> embedder = make_embedder(cfg)                                                 # doctest: +SKIP
    >>> retriever = make_retriever(cfg, embedder, index, bm25, chunks, mode="hybrid")  # doctest: +SKIP
    >>> reranker = make_reranker(cfg, embedder, chunker)                              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.ingestion.chunking import Chunker
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.diversity import DiverseRetriever
from rag.retrieval.embedder import Embedder
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import CrossEncoderReranker, EmbeddingReranker, NoReranker, Reranker
from rag.retrieval.retriever import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    QueryEmbedder,
    QueryRetriever,
)
from rag.retrieval.windows import WindowSource
from rag.types import Chunk


def make_embedder(config: RAGConfig) -> Embedder:
    """The embedder the config names, embedding long chunks as it says (``long_chunks``)."""
    return Embedder(config.embedder, batch_size=config.embed_batch_size, long_texts=config.long_chunks)


def make_retriever(
    config: RAGConfig,
    embedder: QueryEmbedder,
    index: VectorIndex | FederatedIndex,
    bm25: BM25Index | FederatedBM25,
    chunks: Mapping[str, Chunk],
    *,
    mode: RetrievalMode | None = None,
    fusion: Fusion | None = None,
) -> QueryRetriever:
    """The first-stage retriever for ``mode`` (default: the config's); ``fusion`` overrides the
    config's for hybrid mode. With ``max_chunks_per_document`` > 0 its results are diversified."""
    mode = mode or config.retrieval_mode
    dense = DenseRetriever(embedder, index, chunks)
    lexical = BM25Retriever(bm25, chunks)
    retriever: QueryRetriever
    if mode == "dense":
        retriever = dense
    elif mode == "bm25":
        retriever = lexical
    elif mode == "hybrid":
        retriever = HybridRetriever(
            dense,
            lexical,
            fusion=fusion or config.fusion,
            dense_weight=config.dense_weight,
            rrf_k=config.rrf_k,
            pool=config.fusion_pool,
        )
    else:
        raise ValueError(f"mode must be 'dense', 'bm25' or 'hybrid', got {mode!r}")
    if config.max_chunks_per_document > 0:
        return DiverseRetriever(retriever, config.max_chunks_per_document)
    return retriever


def make_reranker(
    config: RAGConfig, embedder: Embedder, chunker: Chunker, windows: WindowSource | None = None
) -> Reranker:
    """The reranker the config names (``reranker``: none, embedding or cross-encoder); the embedding
    reranker reads its window vectors from ``windows`` (a knowledge base) when given."""
    if config.reranker == "embedding":
        return EmbeddingReranker(embedder, chunker, weight=config.rerank_weight, source=windows)
    if config.reranker == "cross-encoder":
        assert config.reranker_model is not None  # checked by RAGConfig
        return CrossEncoderReranker(config.reranker_model)
    return NoReranker()
