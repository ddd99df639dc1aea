"""The data that flows through retrieval: Document in, Chunk stored, ScoredChunk out."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Document(BaseModel):
    """A unit of source text, identified by a stable id.

    Example:
        >>> Document(id="notes.md", text="# Notes\\nCache the prefix.", metadata={"source": "notes.md"}).id
        'notes.md'
    """

    model_config = ConfigDict(frozen=True)

    id: str
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"Document id must be a non-empty string, got {v!r}")
        return v


class Chunk(BaseModel):
    """A token-bounded slice ``document.text[start:end]`` of one document.

    ``chunk_id`` is content-addressed (doc id + text), so an unchanged chunk keeps its id across
    re-ingestion. ``metadata`` carries the document's metadata.

    Example:
        >>> c = Chunk(doc_id="a", chunk_id="3f2a", text="hello", start=0, end=5, n_tokens=1)
        >>> c.end - c.start
        5
    """

    model_config = ConfigDict(frozen=True)

    doc_id: str
    chunk_id: str
    text: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    n_tokens: int = Field(ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _end_not_before_start(self) -> Chunk:
        if self.end < self.start:
            raise ValueError(f"chunk end {self.end} is before start {self.start}")
        return self


class ScoredChunk(BaseModel):
    """A retrieval hit: a chunk and its score (higher is better; scale depends on the stage).

    Example:
        >>> hit = ScoredChunk(doc_id="a", chunk_id="3f2a", score=0.71, text="hello")
        >>> hit.doc_id, round(hit.score, 2)
        ('a', 0.71)
    """

    doc_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, chunk: Chunk, score: float) -> ScoredChunk:
        """The hit for ``chunk`` with ``score``."""
        return cls(
            doc_id=chunk.doc_id,
            chunk_id=chunk.chunk_id,
            score=float(score),
            text=chunk.text,
            metadata=chunk.metadata,
        )
