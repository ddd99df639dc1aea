"""DocumentStore: what the knowledge base needs from wherever its documents are kept.

A store is the record of every collection's documents, their chunks and the chunks' vectors
(computed once, by the writer, and stored: nobody re-embeds what a store holds). Search itself runs
in memory, in each process's ``SearchIndexes`` (FAISS + BM25 per collection), which the store fills
on ``attach`` and keeps in step: with its own writes at once (read your writes), and with other
writers' through its ordered change log (``changes_since``), as far as it has any.

Backends (one module or package each, ``rag.stores.open_store`` picks one from the config):
``rag.stores.local`` (the local index directory: the embedded default, one writer) and
``rag.stores.postgres`` (PostgreSQL: the store of record for many replicas).

Example:
    >>> store = open_store(RAGConfig(index_dir="my-index"))        # doctest: +SKIP
    >>> config = store.check_config(config); store.attach(indexes)  # doctest: +SKIP
    >>> store.write([DocumentWrite("alice", doc, digest, chunks)])  # doctest: +SKIP
    7
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from rag.types import Chunk, Document, DocumentInfo

if TYPE_CHECKING:
    from rag.config import RAGConfig
    from rag.stores.indexes import SearchIndexes

__all__ = [
    "Change",
    "ChangeBatch",
    "ChunkRecord",
    "DocumentStore",
    "DocumentWrite",
    "StoreError",
    "StoreLocked",
    "StoreStatus",
    "StoreUnavailable",
]


@dataclass(frozen=True)
class ChunkRecord:
    """A chunk with its vectors: ``vectors`` [n, dim] float32 (n >= 1) is what dense search matches;
    ``extra`` holds optional named per-chunk vector sets (e.g. a reranker's window vectors), each
    [m, dim'] float32, stored and returned with the chunk."""

    chunk: Chunk
    vectors: np.ndarray
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def chunk_id(self) -> str:
        return self.chunk.chunk_id


@dataclass(frozen=True)
class DocumentWrite:
    """One document as a store keeps it: its text and metadata, the digest of both, and every chunk
    in text order with its vectors. Writing it replaces whatever the collection held under its id."""

    collection: str
    document: Document
    digest: str
    chunks: tuple[ChunkRecord, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.collection, self.document.id)


@dataclass(frozen=True)
class Change:
    """A document changed at ``position`` of a store's log: its state now (None: deleted)."""

    position: int
    collection: str
    doc_id: str
    state: DocumentWrite | None


@dataclass(frozen=True)
class ChangeBatch:
    """The changes after a position, in log order, and the position they bring a reader to."""

    position: int
    changes: list[Change]


@dataclass(frozen=True)
class StoreStatus:
    """What ``/readyz`` reports about the store: whether it answers, and where the log stands."""

    backend: str
    location: str
    reachable: bool
    position: int
    error: str | None = None


class StoreError(Exception):
    """A store that cannot be opened as configured (wrong URL, credentials, incompatible data)."""


class StoreLocked(StoreError):
    """Another process holds the store for writing (a local index directory has one writer)."""


class StoreUnavailable(StoreError):
    """The store does not answer now; the write was not made. Retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@runtime_checkable
class DocumentStore(Protocol):
    """Where a knowledge base keeps its documents; every write is all-or-nothing and durable when it
    returns, and applied to the attached indexes by then."""

    @property
    def backend(self) -> str:
        """The backend's name: ``"local"``, ``"postgresql"``."""
        ...

    @property
    def location(self) -> str:
        """Where the documents are (a directory, a URL without its password, ``"memory"``)."""
        ...

    def check_config(self, config: RAGConfig) -> RAGConfig:
        """``config`` with the ingest-time fields the store was built with (StoreError or ValueError
        naming a field set explicitly to another value)."""
        ...

    def attach(self, indexes: SearchIndexes) -> None:
        """Fill ``indexes`` with every stored document, then keep them in step with the store."""
        ...

    def claim(self) -> None:
        """Become a writer of this store now rather than at the first write (StoreLocked if another
        process may not share it)."""
        ...

    def write(self, writes: Sequence[DocumentWrite]) -> int:
        """Store these documents in one atomic, durable step; return the log position it took. A
        document the store holds with the same digest is left as it is (and shown as stored)."""
        ...

    def delete(self, collection: str, doc_id: str) -> bool:
        """Remove a document durably; False if the collection held no such id."""
        ...

    def read(self, collection: str, doc_id: str) -> DocumentWrite | None:
        """The stored state of a document (the store of record, not the attached indexes)."""
        ...

    def list_documents(self, collections: Iterable[str] | None = None) -> list[DocumentInfo]:
        """Every stored document of ``collections`` (default: all), collection by collection."""
        ...

    def changes_since(self, position: int) -> ChangeBatch:
        """The documents changed after ``position``, in log order, with their current states."""
        ...

    def save(self, directory: Path | None = None, config: RAGConfig | None = None) -> Path:
        """Write the documents as a local index directory (``None``: the store's own, if it has one),
        recording ``config``; return the version written."""
        ...

    def status(self) -> StoreStatus: ...

    def close(self) -> None: ...
