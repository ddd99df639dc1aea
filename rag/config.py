"""RAGConfig: the knobs of the rag layer (retrieval part; prompt and engine fields come later).

Retrieval defaults are the ones measured best on the tuning split of the retrieval eval set
(``prefixrag eval-retrieval``, ``rag.evaluation.evaluate``).

Example:
    >>> cfg = RAGConfig(chunk_size=128, retrieval_mode="dense")
    >>> cfg.chunk_overlap, cfg.top_k
    (32, 4)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.config import EngineConfig
from engine.models import DEFAULT_MODEL
from engine.sampling import DEFAULT_MAX_TOKENS, SamplingParams
from rag.ingestion.chunking import CHUNK_OVERLAP, CHUNK_TOKENS
from rag.prompt.assembler import DEFAULT_SYSTEM_PROMPT
from rag.prompt.order import ChunkOrder
from rag.query import check_top_k
from rag.retrieval.embedder import DEFAULT_EMBEDDER, LongTexts
from rag.retrieval.rerank import RERANK_WEIGHT
from rag.types import check_collection

STORE_SCHEMES = ("postgresql", "postgres")


def check_store_url(url: str) -> str:
    """``url`` if it names a document store this package has (PostgreSQL), else ValueError naming it
    (without its password).

    >>> check_store_url("postgresql://rag@127.0.0.1:5432/rag")
    'postgresql://rag@127.0.0.1:5432/rag'
    """
    parts = urlsplit(url)
    if parts.scheme not in STORE_SCHEMES or not (parts.hostname or parts.query):
        raise ValueError(
            f"document_store must be a PostgreSQL URL (postgresql://user:password@host:port/database), "
            f"got {redact_url(url)!r}"
        )
    return url


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs).

    >>> redact_url("postgresql://rag:s3cret@db:5432/rag")
    'postgresql://rag:***@db:5432/rag'
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


StoreURL = Annotated[str, AfterValidator(check_store_url)]
RetrievalMode = Literal["dense", "bm25", "hybrid"]
Fusion = Literal["weighted", "rrf"]
RerankerName = Literal["none", "embedding", "cross-encoder"]


class RAGConfig(BaseModel):
    """Configuration of ingestion, indexing, retrieval and reranking.

    Example:
        >>> RAGConfig(reranker="cross-encoder", reranker_model="/models/ms-marco-MiniLM-L-6-v2").reranker
        'cross-encoder'
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # ingestion
    embedder: str = Field(
        default=DEFAULT_EMBEDDER, description="registry name or sentence-transformers model dir"
    )
    embed_batch_size: int = Field(default=64, gt=0)
    tokenizer_model: str = Field(
        default=DEFAULT_MODEL,
        description="LLM whose tokenizer measures chunk sizes (engine registry name or dir)",
    )
    chunk_size: int = Field(default=CHUNK_TOKENS, gt=0, description="max LLM tokens per chunk")
    chunk_overlap: int = Field(
        default=CHUNK_OVERLAP, ge=0, description="tokens repeated from the previous chunk"
    )
    title_in_embedding: bool = Field(
        default=True,
        description="prefix each chunk's document title to the text that is embedded and BM25-indexed",
    )
    long_chunks: LongTexts = Field(
        default="windows",
        description="a chunk longer than the embedder reads: 'windows' pools overlapping windows into one "
        "vector, 'truncate' embeds only what fits",
    )
    # retrieval
    top_k: int = Field(default=4, gt=0, description="chunks an answer is grounded on when a call names none")
    retrieval_mode: RetrievalMode = "hybrid"
    fusion: Fusion = "weighted"
    dense_weight: float = Field(
        default=0.7, ge=0.0, le=1.0, description="weighted fusion: dense share; BM25 gets the rest"
    )
    rrf_k: int = Field(default=60, gt=0)
    fusion_pool: int = Field(
        default=50, gt=0, description="candidates taken from each retriever before fusion"
    )
    max_chunks_per_document: int = Field(
        default=1,
        ge=0,
        description="diversity: a document's chunks beyond this many rank after other documents' hits "
        "(0: no cap)",
    )
    # reranking
    reranker: RerankerName = "none"
    reranker_model: str | None = Field(
        default=None, description="local model dir for reranker='cross-encoder'"
    )
    rerank_candidates: int = Field(default=12, gt=0, description="first-stage hits handed to the reranker")
    rerank_weight: float = Field(
        default=RERANK_WEIGHT, ge=0.0, le=1.0, description="embedding reranker: share of the window score"
    )
    # index
    index_kind: Literal["auto", "flat", "hnsw"] = "auto"
    hnsw_threshold: int = Field(default=50_000, gt=0, description="auto: HNSW from this many vectors on")
    index_dir: Path | None = Field(default=None, description="the local index directory (one writer)")
    document_store: StoreURL | None = Field(
        default=None,
        description="a shared document store instead of index_dir: postgresql://user:password@host:port/db",
    )
    # prompt
    system_prompt: str = Field(default=DEFAULT_SYSTEM_PROMPT, min_length=1)
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="JSON schemas, rendered canonically"
    )
    pinned_context: str | None = Field(
        default=None, description="stable background text after the system prompt"
    )
    chunk_order: ChunkOrder = Field(
        default="cache",
        description="order of retrieved chunks: the one the prefix cache holds longest by default",
    )
    public_collections: list[str] = Field(
        default_factory=list,
        description="collections whose chunks are public: the KV of a prompt prefix made only of the "
        "system prompt and their chunks is shared by every namespace (empty: no sharing)",
    )
    # generation
    max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS, gt=0, description="answer length cap (reserved in the context budget)"
    )
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    repetition_penalty: float = Field(
        default=1.1, gt=0.0, le=3.0, description="on the answer's own tokens (llama.cpp's default strength)"
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @field_validator("public_collections")
    @classmethod
    def _collection_names(cls, names: list[str]) -> list[str]:
        return [check_collection(name) for name in names]

    @model_validator(mode="after")
    def _consistent(self) -> RAGConfig:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be < chunk_size ({self.chunk_size})")
        if self.reranker == "cross-encoder" and not self.reranker_model:
            raise ValueError("reranker='cross-encoder' needs reranker_model (a local model directory)")
        if self.index_dir is not None and self.document_store is not None:
            raise ValueError("index_dir and document_store name two stores: set one of them")
        return self

    def resolve_top_k(self, top_k: int | None) -> int:
        """``top_k`` checked (a positive int, else ValueError), or this config's default for None.

        >>> RAGConfig(top_k=6).resolve_top_k(None), RAGConfig().resolve_top_k(2)
        (6, 2)
        """
        return self.top_k if top_k is None else check_top_k(top_k)

    def sampling_params(self, *, max_tokens: int | None = None) -> SamplingParams:
        """How answers are generated: this config's temperature, repetition penalty and length cap,
        with ``max_tokens`` (when given) replacing the cap. Every caller that answers a question
        takes its parameters from here, so an answer does not depend on the route that asked.

        >>> p = RAGConfig().sampling_params(max_tokens=16)
        >>> p.max_tokens, p.temperature, p.repetition_penalty
        (16, 0.0, 1.1)
        """
        return SamplingParams(
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            temperature=self.temperature,
            repetition_penalty=self.repetition_penalty,
        )
