"""The data that flows through retrieval: Document in, Chunk stored, ScoredChunk out.

Every document lives in one named collection (``DEFAULT_COLLECTION`` unless told otherwise); ids are
unique within a collection, so two collections may each hold a ``notes.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_COLLECTION = "default"
# Collection names (tenant names too, since a tenant's private collection bears its name).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def check_collection(name: object) -> str:
    """``name`` if it is a valid collection name, else ValueError naming it and the rule.

    Example:
        >>> check_collection("team-a")
        'team-a'
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"collection {name!r} must be 1-64 characters of letters, digits and ._@:- "
            "(starting with a letter or digit)"
        )
    return name


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

    ``chunk_id`` is content-addressed (collection, doc id, text), so an unchanged chunk keeps its id
    across re-ingestion and no two collections share one. ``metadata`` carries the document's metadata.

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
    collection: str = DEFAULT_COLLECTION

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
    collection: str = DEFAULT_COLLECTION

    @classmethod
    def of(cls, chunk: Chunk, score: float) -> ScoredChunk:
        """The hit for ``chunk`` with ``score``."""
        return cls(
            doc_id=chunk.doc_id,
            chunk_id=chunk.chunk_id,
            score=float(score),
            text=chunk.text,
            metadata=chunk.metadata,
            collection=chunk.collection,
        )


@dataclass(frozen=True)
class DocumentInfo:
    """What ``list_documents`` reports about one stored document."""

    id: str
    metadata: dict[str, Any]
    n_chunks: int
    n_chars: int
    collection: str
