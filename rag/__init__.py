"""rag: ingestion, retrieval, reranking, prompt assembly and the Pipeline API."""

from rag.embedder import DEFAULT_EMBEDDER, Embedder

__all__ = ["DEFAULT_EMBEDDER", "Embedder"]
