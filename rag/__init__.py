"""rag: ingestion, retrieval, reranking, prompt assembly and the Pipeline API."""

# first, before anything loads torch: `prefixrag serve`'s OpenMP wait (libgomp reads it once, at load)
import rag.openmp  # noqa: F401
from rag.config import RAGConfig
from rag.ingestion.chunking import Chunker
from rag.ingestion.loaders import LoadResult, SkippedFile, load_paths, load_python_reference
from rag.knowledge_base import IngestStats, KnowledgeBase, SearchResult
from rag.pipeline import Answer, Pipeline, PipelineEvent, Source, Timings, Usage
from rag.prompt.assembler import Prompt, PromptAssembler, Segment
from rag.retrieval.embedder import DEFAULT_EMBEDDER, Embedder
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import CrossEncoderReranker, EmbeddingReranker, NoReranker, Reranker
from rag.retrieval.retriever import BM25Retriever, DenseRetriever, HybridRetriever, Retriever
from rag.types import Chunk, Document, DocumentInfo, ScoredChunk

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
