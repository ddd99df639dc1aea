"""rag: ingestion, retrieval, reranking, prompt assembly and the Pipeline API."""

from rag.chunking import Chunker
from rag.config import RAGConfig
from rag.documents import Chunk, Document, ScoredChunk
from rag.embedder import DEFAULT_EMBEDDER, Embedder
from rag.index import VectorIndex
from rag.loaders import LoadResult, SkippedFile, load_paths, load_python_reference
from rag.pipeline import Answer, Pipeline, PipelineEvent, Source, Timings, Usage
from rag.prompt import Prompt, PromptAssembler, Segment
from rag.rerank import CrossEncoderReranker, EmbeddingReranker, NoReranker, Reranker
from rag.retriever import BM25Retriever, DenseRetriever, HybridRetriever, Retriever
from rag.store import DocumentInfo, IngestStats, KnowledgeBase, SearchResult

__all__ = [
    "DEFAULT_EMBEDDER",
    "Answer",
    "BM25Retriever",
    "Chunk",
    "Chunker",
    "CrossEncoderReranker",
    "DenseRetriever",
    "Document",
    "DocumentInfo",
    "Embedder",
    "EmbeddingReranker",
    "HybridRetriever",
    "IngestStats",
    "KnowledgeBase",
    "LoadResult",
    "NoReranker",
    "Pipeline",
    "PipelineEvent",
    "Prompt",
    "PromptAssembler",
    "RAGConfig",
    "Reranker",
    "Retriever",
    "ScoredChunk",
    "SearchResult",
    "Segment",
    "SkippedFile",
    "Source",
    "Timings",
    "Usage",
    "VectorIndex",
    "load_paths",
    "load_python_reference",
]
