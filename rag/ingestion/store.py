"""KnowledgeBase: documents in, scored chunks out; the component the Pipeline wraps.

It owns the chunker, the embedder, the FAISS ``VectorIndex``, the ``BM25Index``, the chunk store
and a reranker, and keeps them in step: adding a document chunks it, embeds only chunks it has not
seen (ids are content addresses), and indexes them in FAISS and BM25; re-adding an unchanged
document does nothing; a changed one replaces its chunks; deleting removes them from every index.
``save`` writes one crash-safe version directory (``rag.ingestion.persist``), no pickle anywhere.

Example:
    >>> from rag import Document, KnowledgeBase, RAGConfig
    >>> kb = KnowledgeBase()                                   # bundled embedder, in memory
    >>> kb.add_documents([Document(id="a", text="The pass statement does nothing.")])  # doctest: +SKIP
    ['a']
    >>> [h.doc_id for h in kb.search("which statement does nothing?", top_k=1)]        # doctest: +SKIP
    ['a']
    >>> kb.save("/tmp/kb"); kb2 = KnowledgeBase.load("/tmp/kb")                         # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.ingestion.chunking import Chunker
from rag.ingestion.documents import Chunk, Document, ScoredChunk
from rag.ingestion.index_format import (
    DocumentRecord,
    SavedIndex,
    check_compatible,
    read_config,
    read_index,
    write_index,
)
from rag.ingestion.loaders import LoadResult, load_paths
from rag.ingestion.persist import current_version, save_version
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.embedder import Embedder
from rag.retrieval.factory import make_embedder, make_reranker, make_retriever
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import Reranker
from rag.retrieval.retriever import Retriever, check_query

_EMBED_CALL = 256  # texts per embed() call (progress granularity; the model batches inside)


@dataclass(frozen=True)
class DocumentInfo:
    """What ``list_documents`` reports about one stored document."""

    id: str
    metadata: dict[str, Any]
    n_chunks: int
    n_chars: int


@dataclass(frozen=True)
class IngestStats:
    """What the last ``add_documents`` call did."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    chunks_embedded: int = 0
    chunks_removed: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class SearchResult:
    """Hits of ``KnowledgeBase.search_timed`` and the milliseconds each stage took."""

    hits: list[ScoredChunk]
    retrieve_ms: float
    rerank_ms: float


def document_title(doc: Document) -> str | None:
    """A document's title: ``metadata["title"]``, a leading markdown heading, or a short first line
    that is underlined or followed by a blank line; None when there is no such line."""
    title = doc.metadata.get("title")
    if isinstance(title, str) and title.strip():
        return " ".join(title.split())
    lines = doc.text.lstrip().splitlines()
    if not lines:
        return None
    first = lines[0].strip()
    if first.startswith("#"):
        first = first.lstrip("#").strip()
    elif len(lines) > 1 and lines[1].strip() and not re.fullmatch(r"[=\-*~^#]{3,}", lines[1].strip()):
        return None
    return first if 0 < len(first) <= 120 else None


def _digest(doc: Document) -> str:
    payload = json.dumps([doc.text, doc.model_dump(mode="json")["metadata"]], sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class KnowledgeBase:
    """Chunked, embedded, indexed documents with dense, BM25 and hybrid search and reranking.

    Construct with a ``RAGConfig`` (defaults: bundled MiniLM embedder, 256/32-token chunks, hybrid
    weighted fusion); pass ``embedder``/``chunker``/``reranker`` to share or replace components (the
    config then records the embedder name and chunk sizes of the components given).
    Models load lazily (or call ``warm_up()``). All public methods are thread-safe.

    Example:
        >>> from rag import RAGConfig, load_python_reference
        >>> kb = KnowledgeBase(RAGConfig(retrieval_mode="hybrid", top_k=4))
        >>> ids = kb.add_documents(load_python_reference(), show_progress=True)   # doctest: +SKIP
        >>> hits = kb.search("how do I catch two exception types?")               # doctest: +SKIP
        >>> hits[0].doc_id, hits[0].chunk_id, round(hits[0].score, 2), hits[0].text[:40]  # doctest: +SKIP
        ('try', '4c1d0e...', 0.97, 'The "try" statement ...')
        >>> result = kb.search_timed("what does pass do?")                       # doctest: +SKIP
        >>> result.hits[0].doc_id, result.retrieve_ms, result.rerank_ms            # doctest: +SKIP
        ('pass', 41.2, 0.0)
        >>> kb.delete_document("try"); path = kb.save("~/.cache/prefixrag/index")  # doctest: +SKIP
        >>> kb = KnowledgeBase.load(path.parent)                                   # doctest: +SKIP
    """

    def __init__(
        self,
        config: RAGConfig | None = None,
        *,
        embedder: Embedder | None = None,
        chunker: Chunker | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        cfg = config or RAGConfig()
        if embedder is not None:  # the config records what the index is really built with
            cfg = cfg.model_copy(update={"embedder": embedder.model_name, "long_chunks": embedder.long_texts})
        if chunker is not None:
            cfg = cfg.model_copy(update={"chunk_size": chunker.chunk_size, "chunk_overlap": chunker.overlap})
        self.config = cfg
        self.embedder = embedder or make_embedder(cfg)
        self.chunker = chunker or Chunker(cfg.tokenizer_model, cfg.chunk_size, cfg.chunk_overlap)
        self._reranker = reranker
        self._docs: dict[str, DocumentRecord] = {}
        self._chunks: dict[str, Chunk] = {}
        self._index: VectorIndex | None = None  # created when the embedding dim is known
        self._bm25 = BM25Index()
        self._lock = threading.RLock()
        self.last_ingest = IngestStats()

    @classmethod
    def from_config(cls, config: RAGConfig) -> KnowledgeBase:
        """Same as ``KnowledgeBase(config)``."""
        return cls(config)

    def warm_up(self) -> None:
        """Load the embedder, the tokenizer and the reranker's model now rather than on first use."""
        self.embedder.warm_up()
        self.chunker.warm_up()
        warm = getattr(self.reranker, "warm_up", None)
        if callable(warm):
            warm()

    # -- documents --------------------------------------------------------------------------------
    def add_documents(self, docs: Iterable[Document], *, show_progress: bool = False) -> list[str]:
        """Add or update documents; return their ids in input order.

        Unchanged documents (same text and metadata) are skipped; a changed document's chunks are
        replaced (chunks whose text is unchanged keep their vectors). ValueError for a non-Document,
        a document with no text, or an id given twice. ``last_ingest`` tells what happened.
        """
        docs = list(docs)
        self._validate(docs)
        t0 = time.perf_counter()
        with self._lock:
            changed = [(doc, d) for doc in docs if self._needs_update(doc.id, d := _digest(doc))]
            updates = sum(doc.id in self._docs for doc, _ in changed)
            new_chunks = {doc.id: self._chunk(doc) for doc, _ in changed}
            to_embed = [c for chunks in new_chunks.values() for c in chunks if self._must_embed(c)]
            vectors = self._embed([self.search_text(c) for c in to_embed], show_progress)
            removed = sum(self._replace(doc, digest, new_chunks[doc.id]) for doc, digest in changed)
            self._index_new(to_embed, vectors)
            self.last_ingest = IngestStats(
                added=len(changed) - updates,
                updated=updates,
                unchanged=len(docs) - len(changed),
                chunks_embedded=len(to_embed),
                chunks_removed=removed,
                seconds=time.perf_counter() - t0,
            )
        return [doc.id for doc in docs]

    def ingest(
        self, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, show_progress: bool = False
    ) -> LoadResult:
        """Load files/folders (``rag.ingestion.loaders.load_paths``) and add them; the result lists what was skipped."""
        result = load_paths(paths)
        self.add_documents(result.documents, show_progress=show_progress)
        return result

    def delete_document(self, doc_id: str) -> bool:
        """Remove a document and its chunks from every index; False if there was no such document."""
        with self._lock:
            record = self._docs.pop(doc_id, None)
            if record is None:
                return False
            self._drop_chunks(record.chunk_ids)
            return True

    def get_document(self, doc_id: str) -> Document | None:
        """The stored document, or None."""
        record = self._docs.get(doc_id)
        return record.doc if record else None

    def list_documents(self) -> list[DocumentInfo]:
        """Id, metadata and size of every stored document, in insertion order."""
        with self._lock:
            return [
                DocumentInfo(r.doc.id, dict(r.doc.metadata), len(r.chunk_ids), len(r.doc.text))
                for r in self._docs.values()
            ]

    def chunks_of(self, doc_id: str) -> list[Chunk]:
        """A document's chunks in text order (empty if unknown)."""
        record = self._docs.get(doc_id)
        return [self._chunks[c] for c in record.chunk_ids] if record else []

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    @property
    def n_chunks(self) -> int:
        return len(self._chunks)

    # -- search -----------------------------------------------------------------------------------
    def search(
        self,
        query: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        rerank: bool | None = None,
    ) -> list[ScoredChunk]:
        """The ``top_k`` best chunks for ``query``: first-stage ``mode`` then (if enabled) the reranker.

        Defaults come from the config (``top_k``, ``retrieval_mode``, ``reranker``).
        """
        return self.search_timed(query, top_k, mode, rerank).hits

    def search_timed(
        self,
        query: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        rerank: bool | None = None,
    ) -> SearchResult:
        """``search`` that also reports how long the first stage and the reranker took."""
        top_k = self.config.top_k if top_k is None else top_k
        check_query(query, top_k)
        use_reranker = self.config.reranker != "none" if rerank is None else rerank
        t0 = time.perf_counter()
        depth = max(top_k, self.config.rerank_candidates) if use_reranker else top_k
        hits = self.retrieve(query, depth, mode)
        t1 = time.perf_counter()
        if use_reranker:
            hits = self.rerank(query, hits, top_k)
        t2 = time.perf_counter()
        return SearchResult(hits, retrieve_ms=1000 * (t1 - t0), rerank_ms=1000 * (t2 - t1))

    def retrieve(
        self, query: str, top_k: int | None = None, mode: RetrievalMode | None = None
    ) -> list[ScoredChunk]:
        """First-stage retrieval only (no reranking), best first."""
        top_k = self.config.top_k if top_k is None else top_k
        check_query(query, top_k)
        with self._lock:
            return self.retriever(mode).retrieve(query, top_k)

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int | None = None) -> list[ScoredChunk]:
        """Apply the configured reranker to first-stage hits."""
        top_k = self.config.top_k if top_k is None else top_k
        check_query(query, top_k)
        with self._lock:
            return self.reranker.rerank(query, hits, top_k)

    def retriever(self, mode: RetrievalMode | None = None, fusion: Fusion | None = None) -> Retriever:
        """The first-stage retriever for ``mode`` (default: the config's), over this knowledge base;
        ``fusion`` overrides the config's for hybrid mode."""
        return make_retriever(
            self.config,
            self.embedder,
            self._vector_index(),
            self._bm25,
            self._chunks,
            mode=mode,
            fusion=fusion,
        )

    @property
    def reranker(self) -> Reranker:
        """The reranker: the one passed in, else the one the config names."""
        if self._reranker is None:
            self._reranker = make_reranker(self.config, self.embedder, self.chunker)
        return self._reranker

    def search_text(self, chunk: Chunk) -> str:
        """What is embedded and BM25-indexed for a chunk: its text, after its title when configured."""
        title = chunk.metadata.get("title") if self.config.title_in_embedding else None
        if not title or chunk.text.startswith(title):
            return chunk.text
        return f"{title}\n\n{chunk.text}"

    # -- persistence ------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str] | None = None) -> Path:
        """Write everything into a new version under ``directory`` (default: ``config.index_dir``),
        atomically; return the version directory. The previous version stays loadable until the
        new one is complete."""
        target = directory if directory is not None else self.config.index_dir
        if target is None:
            raise ValueError("save needs a directory (argument or RAGConfig.index_dir), got None")
        with self._lock:
            return save_version(Path(target).expanduser(), self._write)

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str],
        config: RAGConfig | None = None,
        *,
        embedder: Embedder | None = None,
        chunker: Chunker | None = None,
        reranker: Reranker | None = None,
    ) -> KnowledgeBase:
        """Load the current version saved under ``directory``.

        Without ``config`` the saved one is used. A config may change query-time settings (mode,
        top_k, reranker, ...); ingest-time ones (embedder, tokenizer, chunk sizes) must match the
        saved index, else ValueError.
        """
        version = current_version(Path(directory).expanduser())
        saved = read_config(version)
        config = check_compatible(config, saved, version) if config else saved
        config = config.model_copy(update={"index_dir": Path(directory)})
        kb = cls(config, embedder=embedder, chunker=chunker, reranker=reranker)
        kb._adopt(read_index(version, config))
        return kb

    # -- internals --------------------------------------------------------------------------------
    def _validate(self, docs: list[Document]) -> None:
        seen: set[str] = set()
        for doc in docs:
            if not isinstance(doc, Document):
                raise ValueError(f"expected Document, got {type(doc).__name__}: {doc!r:.80}")
            if not doc.text.strip():
                raise ValueError(f"document {doc.id!r} is empty (no text to index)")
            if doc.id in seen:
                raise ValueError(f"document id {doc.id!r} appears twice in one add_documents call")
            seen.add(doc.id)

    def _needs_update(self, doc_id: str, digest: str) -> bool:
        record = self._docs.get(doc_id)
        return record is None or record.digest != digest

    def _chunk(self, doc: Document) -> list[Chunk]:
        title = document_title(doc)
        chunks = self.chunker.split(doc)
        if title:
            chunks = [c.model_copy(update={"metadata": {**c.metadata, "title": title}}) for c in chunks]
        return chunks

    def _must_embed(self, chunk: Chunk) -> bool:
        old = self._chunks.get(chunk.chunk_id)
        return old is None or self.search_text(old) != self.search_text(chunk)

    def _embed(self, texts: list[str], show_progress: bool) -> np.ndarray:
        """Embed in calls of _EMBED_CALL texts with a progress bar."""
        from tqdm.auto import tqdm

        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        parts = []
        with tqdm(total=len(texts), desc="embedding", unit="chunk", disable=not show_progress) as bar:
            for i in range(0, len(texts), _EMBED_CALL):
                parts.append(self.embedder.embed(texts[i : i + _EMBED_CALL]))
                bar.update(len(parts[-1]))
        return np.concatenate(parts)

    def _replace(self, doc: Document, digest: str, chunks: list[Chunk]) -> int:
        """Swap in a document's new chunk list; return how many old chunks were dropped."""
        old = self._docs.get(doc.id)
        new_ids = [c.chunk_id for c in chunks]
        stale = [c for c in (old.chunk_ids if old else []) if c not in set(new_ids)]
        self._drop_chunks(stale)
        for chunk in chunks:
            self._chunks[chunk.chunk_id] = chunk  # refreshed metadata; vectors kept unless re-embedded
        self._docs[doc.id] = DocumentRecord(doc, digest, new_ids)
        return len(stale)

    def _drop_chunks(self, chunk_ids: Sequence[str]) -> None:
        self._vector_index().delete(chunk_ids)
        self._bm25.delete(chunk_ids)
        for chunk_id in chunk_ids:
            self._chunks.pop(chunk_id, None)

    def _index_new(self, chunks: list[Chunk], vectors: np.ndarray) -> None:
        ids = [c.chunk_id for c in chunks]
        index = self._vector_index()
        index.delete(ids)  # a re-embedded chunk replaces its old vector
        index.add(ids, vectors)
        self._bm25.add(ids, [self.search_text(c) for c in chunks])

    def _vector_index(self) -> VectorIndex:
        if self._index is None:
            cfg = self.config
            self._index = VectorIndex(
                self.embedder.dim, kind=cfg.index_kind, hnsw_threshold=cfg.hnsw_threshold
            )
        return self._index

    def _write(self, directory: Path) -> None:
        write_index(directory, self.config, list(self._docs.values()), self._chunks, self._vector_index())

    def _adopt(self, saved: SavedIndex) -> None:
        self._chunks = saved.chunks
        self._docs = {r.doc.id: r for r in saved.records}
        self._index = saved.index
        self._bm25 = BM25Index()
        ids = list(self._chunks)
        self._bm25.add(ids, [self.search_text(self._chunks[c]) for c in ids])
