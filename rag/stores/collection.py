"""Collection: one named set of documents with its own chunk store, FAISS index and BM25 index.

A collection's search touches only its own vectors and its own BM25 statistics, so searching it gives
exactly what indexing its documents alone would give, and no other collection's content (or term
frequencies) can move its results. Documents come and go whole (``put``: a ``DocumentWrite`` with
every chunk and its vectors; ``delete``); a chunk kept with the same search text keeps its vector.
A chunk may also carry named extra vector sets (``extra``: e.g. the window vectors the embedding
reranker reads, ``rag.retrieval.windows``), exactly those its last write gave it, dropped with the
chunk; ``keep_vectors`` adds rows computed later (a local store's next save writes them).

Example:
    >>> coll = Collection("alice", lambda dim: VectorIndex(dim), lambda: 384, lambda c: c.text)  # doctest: +SKIP
    >>> coll.put(write); [info.id for info in coll.infos()]                                      # doctest: +SKIP
    ['notes.md']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rag.retrieval.bm25 import BM25Index
from rag.retrieval.index import VectorIndex
from rag.stores.protocol import ChunkRecord, DocumentWrite
from rag.types import Chunk, Document, DocumentInfo, check_collection

SearchText = Callable[[Chunk], str]


@dataclass
class DocumentRecord:
    """A stored document, the digest of its text and metadata, and its chunks' ids in text order."""

    doc: Document
    digest: str
    chunk_ids: list[str]


@dataclass
class CollectionParts:
    """A whole collection as a store loads it: documents in order, chunks, the FAISS index, extra
    vector sets."""

    records: list[DocumentRecord]
    chunks: dict[str, Chunk]
    index: VectorIndex
    extra: dict[str, dict[str, np.ndarray]]


class Collection:
    """Documents, chunks, vectors and BM25 terms of one collection, kept in step.

    Not thread-safe on its own: the owning ``SearchIndexes.lock`` guards every call.

    Example:
        >>> coll = Collection("shared", lambda dim: VectorIndex(dim, kind="flat"), lambda: 2, lambda c: c.text)
        >>> coll.name, len(coll), coll.n_chunks
        ('shared', 0, 0)
    """

    def __init__(
        self,
        name: str,
        new_index: Callable[[int], VectorIndex],
        default_dim: Callable[[], int],
        search_text: SearchText,
    ) -> None:
        self.name = check_collection(name)
        self.docs: dict[str, DocumentRecord] = {}
        self.chunks: dict[str, Chunk] = {}
        self.extra: dict[str, dict[str, np.ndarray]] = {}  # vector set name -> chunk id -> [m, dim]
        self.bm25 = BM25Index()
        self.changes = 0  # bumped by every mutation: what a save compares to reuse unchanged files
        self._new_index = new_index
        self._default_dim = default_dim
        self._search_text = search_text
        self._index: VectorIndex | None = None  # created when first needed (the vectors' dim)

    def __len__(self) -> int:
        return len(self.docs)

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    @property
    def dim(self) -> int | None:
        """The vectors' dimension, once the collection has an index."""
        return self._index.dim if self._index is not None else None

    @property
    def index(self) -> VectorIndex:
        if self._index is None:
            self._index = self._new_index(self._default_dim())
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

    def known_vectors(self, chunk: Chunk) -> ChunkRecord | None:
        """The stored vectors of a chunk with this id and the same search text (None: embed it)."""
        old = self.chunks.get(chunk.chunk_id)
        if old is None or self._search_text(old) != self._search_text(chunk):
            return None
        vectors = self.index.vectors_of(chunk.chunk_id)
        if not len(vectors):
            return None
        extra = {name: by_id[chunk.chunk_id] for name, by_id in self.extra.items() if chunk.chunk_id in by_id}
        return ChunkRecord(chunk, vectors, extra)

    def vector_set(self, name: str) -> dict[str, np.ndarray]:
        """The rows of the extra vector set ``name`` this collection holds: chunk id -> [m, dim]
        (empty when it holds none; read it, change it through ``keep_vectors``)."""
        return self.extra.get(name, {})

    def record(self, doc_id: str) -> DocumentWrite | None:
        """A document's whole state, as a store writes it (None if unknown)."""
        record = self.docs.get(doc_id)
        if record is None:
            return None
        chunks = []
        for chunk_id in record.chunk_ids:
            extra = {name: by_id[chunk_id] for name, by_id in self.extra.items() if chunk_id in by_id}
            chunks.append(ChunkRecord(self.chunks[chunk_id], self.index.vectors_of(chunk_id), extra))
        return DocumentWrite(self.name, record.doc, record.digest, tuple(chunks))

    # -- writes -----------------------------------------------------------------------------------
    def put(self, write: DocumentWrite) -> int:
        """Make a document exactly ``write``; return how many of its old chunks were dropped. A chunk
        kept with the same search text keeps its indexed vector (the same text has the same vector)."""
        doc = write.document
        old = self.docs.get(doc.id)
        new_ids = [r.chunk_id for r in write.chunks]
        keep = set(new_ids)
        stale = [c for c in (old.chunk_ids if old else []) if c not in keep]
        self.drop_chunks(stale)
        fresh = [r for r in write.chunks if not self._indexed_as(r.chunk)]
        for record in write.chunks:
            self.chunks[record.chunk_id] = record.chunk  # refreshed metadata
            for name, by_id in self.extra.items():  # exactly the sets the write gives it
                if name not in record.extra:
                    by_id.pop(record.chunk_id, None)
            for name, vectors in record.extra.items():
                self.extra.setdefault(name, {})[record.chunk_id] = vectors
        self._index_vectors(fresh)
        self.docs[doc.id] = DocumentRecord(doc, write.digest, new_ids)
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
            for by_id in self.extra.values():
                by_id.pop(chunk_id, None)
        self.changes += 1

    def keep_vectors(self, name: str, rows: Mapping[str, np.ndarray]) -> None:
        """Add rows to the extra vector set ``name`` for chunks of this collection (rows of chunks it
        does not hold are ignored): vectors computed after the chunk was stored, such as window
        vectors an index saved without them gets on first use. Counts as a change, so a local
        store's next save writes them."""
        kept = {chunk_id: v for chunk_id, v in rows.items() if chunk_id in self.chunks}
        if kept:
            self.extra.setdefault(name, {}).update(kept)
            self.changes += 1

    def drop_vector_set(self, name: str) -> None:
        """Forget the extra vector set ``name`` (e.g. window vectors computed with other settings)."""
        if self.extra.pop(name, None) is not None:
            self.changes += 1

    def adopt(self, parts: CollectionParts) -> None:
        """Take over a whole collection at once (a store's load); BM25 is built from the chunk texts."""
        self.docs = {r.doc.id: r for r in parts.records}
        self.chunks = parts.chunks
        self.extra = parts.extra
        self._index = parts.index
        self.bm25 = BM25Index()
        ids = list(self.chunks)
        self.bm25.add(ids, [self._search_text(self.chunks[c]) for c in ids])
        self.changes += 1

    def _indexed_as(self, chunk: Chunk) -> bool:
        old = self.chunks.get(chunk.chunk_id)
        same = old is not None and self._search_text(old) == self._search_text(chunk)
        return same and chunk.chunk_id in self.index

    def _index_vectors(self, records: Sequence[ChunkRecord]) -> None:
        """Index fresh chunks (a re-embedded chunk replaces its old vectors)."""
        if not records:
            return
        ids = [r.chunk_id for r in records]
        if self._index is None:
            self._index = self._new_index(records[0].vectors.shape[1])
        keys = [r.chunk_id for r in records for _ in range(len(r.vectors))]
        self.index.delete(ids)
        self.index.add(keys, np.concatenate([r.vectors for r in records]))
        self.bm25.add(ids, [self._search_text(r.chunk) for r in records])
