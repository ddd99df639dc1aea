"""Collection: one named set of documents with its own chunk store, FAISS index and BM25 index.

The knowledge base keeps one per name. A collection's search touches only its own vectors and its
own BM25 statistics, so searching it gives exactly what indexing its documents alone would give, and
no other collection's content (or term frequencies) can move its results. Each chunk may also carry
its window vectors (``windows``: what the embedding reranker reads, ``rag.retrieval.windows``),
dropped with the chunk or when its text changes.

Example:
    >>> coll = Collection("alice", lambda: VectorIndex(dim=384))           # doctest: +SKIP
    >>> coll.replace(doc, digest, chunks); coll.index_new(chunks, vectors, texts)  # doctest: +SKIP
    >>> [info.id for info in coll.infos()]                                   # doctest: +SKIP
    ['notes.md']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.retrieval.bm25 import BM25Index
from rag.retrieval.index import VectorIndex
from rag.types import Chunk, Document, check_collection


@dataclass
class DocumentRecord:
    """A stored document, the digest of its text and metadata, and its chunks' ids in text order."""

    doc: Document
    digest: str
    chunk_ids: list[str]


@dataclass(frozen=True)
class DocumentInfo:
    """What ``list_documents`` reports about one stored document."""

    id: str
    metadata: dict[str, Any]
    n_chunks: int
    n_chars: int
    collection: str


class Collection:
    """Documents, chunks, vectors and BM25 terms of one collection, kept in step.

    Not thread-safe on its own: the KnowledgeBase's lock guards every call.

    Example:
        >>> coll = Collection("shared", lambda: VectorIndex(dim=2, kind="flat"))
        >>> coll.name, len(coll), coll.n_chunks
        ('shared', 0, 0)
    """

    def __init__(self, name: str, make_index: Callable[[], VectorIndex]) -> None:
        self.name = check_collection(name)
        self.docs: dict[str, DocumentRecord] = {}
        self.chunks: dict[str, Chunk] = {}
        self.bm25 = BM25Index()
        self.windows: dict[str, np.ndarray] = {}  # chunk id -> [windows, dim] window vectors
        self.changes = 0  # bumped by every mutation: what a save compares to reuse unchanged files
        self._make_index = make_index
        self._index: VectorIndex | None = None  # created when first needed (the embedder's dim)

    def __len__(self) -> int:
        return len(self.docs)

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    @property
    def index(self) -> VectorIndex:
        if self._index is None:
            self._index = self._make_index()
        return self._index

    # -- reads ------------------------------------------------------------------------------------
    def get(self, doc_id: str) -> Document | None:
        record = self.docs.get(doc_id)
        return record.doc if record else None

    def chunks_of(self, doc_id: str) -> list[Chunk]:
        record = self.docs.get(doc_id)
        return [self.chunks[c] for c in record.chunk_ids] if record else []

    def infos(self) -> list[DocumentInfo]:
        return [
            DocumentInfo(r.doc.id, dict(r.doc.metadata), len(r.chunk_ids), len(r.doc.text), self.name)
            for r in self.docs.values()
        ]

    def needs_update(self, doc_id: str, digest: str) -> bool:
        record = self.docs.get(doc_id)
        return record is None or record.digest != digest

    # -- writes -----------------------------------------------------------------------------------
    def replace(self, doc: Document, digest: str, chunks: list[Chunk]) -> int:
        """Swap in a document's new chunk list; return how many old chunks were dropped."""
        old = self.docs.get(doc.id)
        new_ids = [c.chunk_id for c in chunks]
        keep = set(new_ids)
        stale = [c for c in (old.chunk_ids if old else []) if c not in keep]
        self.drop_chunks(stale)
        for chunk in chunks:
            before = self.chunks.get(chunk.chunk_id)
            if before is not None and _window_text(before) != _window_text(chunk):
                self.windows.pop(chunk.chunk_id, None)  # its windows read the old title
            self.chunks[chunk.chunk_id] = chunk  # refreshed metadata; vectors kept unless re-embedded
        self.docs[doc.id] = DocumentRecord(doc, digest, new_ids)
        self.changes += 1
        return len(stale)

    def delete(self, doc_id: str) -> bool:
        """Remove a document and its chunks from every index; False if there was no such document."""
        record = self.docs.pop(doc_id, None)
        if record is None:
            return False
        self.drop_chunks(record.chunk_ids)
        self.changes += 1
        return True

    def drop_chunks(self, chunk_ids: Sequence[str]) -> None:
        if not chunk_ids:
            return
        self.index.delete(chunk_ids)
        self.bm25.delete(chunk_ids)
        for chunk_id in chunk_ids:
            self.chunks.pop(chunk_id, None)
            self.windows.pop(chunk_id, None)
        self.changes += 1

    def index_new(
        self,
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        texts: Sequence[str],
        windows: Sequence[np.ndarray] | None = None,
    ) -> None:
        """Index freshly embedded chunks (a re-embedded chunk replaces its old vector and, when
        ``windows`` are given, its window vectors; otherwise its old ones are dropped)."""
        if not chunks:
            return
        ids = [c.chunk_id for c in chunks]
        self.index.delete(ids)
        self.index.add(ids, vectors)
        self.bm25.add(ids, texts)
        for n, chunk_id in enumerate(ids):
            if windows is None:
                self.windows.pop(chunk_id, None)
            else:
                self.windows[chunk_id] = windows[n]
        self.changes += 1

    def set_windows(self, chunk_ids: Sequence[str], windows: Sequence[np.ndarray]) -> None:
        """Keep window vectors computed for chunks of this collection (a later save writes them)."""
        for chunk_id, vectors in zip(chunk_ids, windows, strict=True):
            if chunk_id in self.chunks:
                self.windows[chunk_id] = vectors
        self.changes += 1

    def adopt(
        self,
        records: Sequence[DocumentRecord],
        chunks: dict[str, Chunk],
        index: VectorIndex,
        search_text: Callable[[Chunk], str],
        windows: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Take over what was read from disk; BM25 is rebuilt from the chunk texts (it is not saved)."""
        self.docs = {r.doc.id: r for r in records}
        self.chunks = chunks
        self.windows = {k: v for k, v in (windows or {}).items() if k in chunks}
        self._index = index
        self.bm25 = BM25Index()
        ids = list(chunks)
        self.bm25.add(ids, [search_text(chunks[c]) for c in ids])


def _window_text(chunk: Chunk) -> tuple[str, object]:
    """What a chunk's window vectors are computed from."""
    return chunk.text, chunk.metadata.get("title")
