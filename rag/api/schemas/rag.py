"""Bodies of the RAG routes: /v1/ask and /v1/documents."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.chunks.reuse import ReuseMode
from rag.api.schemas.types import Bool, Int, RequestModel
from rag.results import Answer, Source, Timings, Usage
from rag.types import DEFAULT_COLLECTION, NAME_PATTERN

# JSON-schema patterns (documentation for clients and fuzzers; the routers check the same rules)
MAX_DEPTH = 16  # metadata nesting
VISIBLE_TEXT = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"  # some non-space character, no NUL
PRINTABLE_ID = (
    r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$"
)
MAX_COLLECTIONS = 64  # named in one request
CollectionName = Annotated[str, Field(min_length=1, max_length=64, pattern=NAME_PATTERN)]
Collections = Annotated[
    list[CollectionName],
    Field(
        min_length=1,
        max_length=MAX_COLLECTIONS,
        description="search only these collections; each must be readable with the caller's key "
        "(404 `collection_not_found` otherwise, the same answer as for a collection that does not "
        "exist). Default: every collection the key may read",
    ),
]


class AskRequest(RequestModel):
    """``{"question": ..., "top_k"?: int, "stream"?: bool}``; limits come from the settings."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(
        min_length=1,
        description="the question (at most `max_question_chars`; not only whitespace, no NUL)",
        json_schema_extra={"pattern": VISIBLE_TEXT},
    )
    top_k: Int | None = Field(default=None, description="chunks to retrieve (1..`max_top_k`)")
    stream: Bool = False
    max_tokens: Int | None = Field(
        default=None, ge=1, description="answer length cap (default: the pipeline's)"
    )
    collections: Collections | None = None
    reuse: ReuseMode | None = Field(
        default=None,
        description="KV reuse for this question (default: the server's): 'prefix' is exact; 'chunks' also "
        "reuses cached chunks wherever they stand, recomputing a share of their tokens (approximate)",
    )


class SourceOut(BaseModel):
    """A retrieved chunk the answer may cite as ``[n]`` (``sources[n - 1]``), in prompt order."""

    doc_id: str
    chunk_id: str
    score: float = Field(
        description="cosine similarity of the question's and the chunk's embeddings, from -1 to 1 "
        "(higher is closer); the same measure on every route (/v1/ask, chat with `rag`), whatever "
        "retrieval mode, fusion or reranker picked the chunk and however many chunks were candidates"
    )
    text: str
    collection: str = DEFAULT_COLLECTION

    @classmethod
    def of(cls, source: Source) -> SourceOut:
        return cls(
            doc_id=source.doc_id,
            chunk_id=source.chunk_id,
            score=source.score,
            text=source.text,
            collection=source.collection,
        )


class AskUsage(BaseModel):
    prompt_tokens: int
    cached_tokens: int = Field(description="prompt tokens reused from the exact prefix cache")
    completion_tokens: int
    total_tokens: int
    stitched_tokens: int = Field(
        default=0, description="prompt tokens whose KV came from cached chunks at other positions"
    )
    recomputed_tokens: int = Field(
        default=0, description="reused chunk tokens computed again so the chunks see each other"
    )
    stitch_deviation: float | None = Field(
        default=None,
        description="how far a stitched prompt was from exact, 0 to 1: the share of the question's attention, "
        "at the engine's selection layer, on chunk tokens whose KV was reused at a new position and not "
        "recomputed (null when nothing was stitched); the benchmark report relates it to answer changes",
    )
    reuse: str = Field(default="prefix", description="the KV reuse mode that served the question")

    @classmethod
    def of(cls, usage: Usage) -> AskUsage:
        return cls(
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            stitched_tokens=usage.stitched_tokens,
            recomputed_tokens=usage.recomputed_tokens,
            stitch_deviation=usage.stitch_deviation,
            reuse=usage.reuse,
        )


class TimingsOut(BaseModel):
    """Milliseconds: every timing the pipeline measures, from the moment the question reached it."""

    retrieve_ms: float = Field(description="first-stage retrieval, milliseconds")
    rerank_ms: float = Field(description="reranking, milliseconds (0 without a reranker)")
    assemble_ms: float = Field(
        description="prompt assembly (tokenization, the cache-aware chunk order), milliseconds"
    )
    prefill_ms: float = Field(
        description="the engine's share of `ttft_ms`: its queue and the prefill of the uncached suffix, "
        "milliseconds"
    )
    ttft_ms: float = Field(description="to the first answer token, retrieval included, milliseconds")
    total_ms: float = Field(description="to the last answer token, milliseconds")

    @classmethod
    def of(cls, timings: Timings) -> TimingsOut:
        return cls(
            retrieve_ms=timings.retrieve_ms,
            rerank_ms=timings.rerank_ms,
            assemble_ms=timings.assemble_ms,
            prefill_ms=timings.prefill_ms,
            ttft_ms=timings.ttft_ms,
            total_ms=timings.total_ms,
        )


class AskResponse(BaseModel):
    id: str
    object: Literal["answer"] = "answer"
    model: str
    text: str
    sources: list[SourceOut]
    usage: AskUsage
    timings: TimingsOut
    finish_reason: str = "stop"

    @classmethod
    def of(cls, answer: Answer, *, answer_id: str, model: str) -> AskResponse:
        return cls(
            id=answer_id,
            model=model,
            text=answer.text,
            sources=[SourceOut.of(s) for s in answer.sources],
            usage=AskUsage.of(answer.usage),
            timings=TimingsOut.of(answer.timings),
            finish_reason=answer.finish_reason,
        )


class DocumentIn(RequestModel):
    """A document to add: ``text``, an optional ``id`` (default: derived from the text), ``metadata``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="default: derived from the text; no control characters",
        json_schema_extra={"pattern": PRINTABLE_ID},
    )
    text: str = Field(min_length=1, json_schema_extra={"pattern": VISIBLE_TEXT})
    metadata: dict[str, Any] = Field(
        default_factory=dict, description=f"JSON, nested at most {MAX_DEPTH} deep"
    )

    @field_validator("metadata")
    @classmethod
    def _storable(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        _check_json(metadata, 1)
        return metadata


def _check_json(value: Any, depth: int) -> None:
    """Metadata is saved as JSON: bounded nesting."""
    if depth > MAX_DEPTH:
        raise ValueError(f"metadata is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                "metadata contains a string that is not valid Unicode (a lone surrogate)"
            ) from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, depth)
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)


class DocumentsIn(RequestModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)


class AddedDocuments(BaseModel):
    object: Literal["list"] = "list"
    ids: list[str]
    count: int
    collection: str = Field(default=DEFAULT_COLLECTION, description="where the documents were stored")


class DocumentOut(BaseModel):
    id: str
    object: Literal["document"] = "document"
    collection: str = DEFAULT_COLLECTION
    metadata: dict[str, Any] = Field(default_factory=dict)
    text: str | None = None
    chunks: int | None = Field(default=None, description="number of chunks indexed")
    chars: int | None = Field(default=None, description="length of the text")


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentOut]


class DeletedDocument(BaseModel):
    id: str
    object: Literal["document"] = "document"
    collection: str = DEFAULT_COLLECTION
    deleted: bool = True


class CollectionOut(BaseModel):
    name: str
    object: Literal["collection"] = "collection"
    writable: bool = Field(description="whether this key may add and delete documents here")
    home: bool = Field(description="where this key's documents go when a request names no collection")
    documents: int


class CollectionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CollectionOut]
