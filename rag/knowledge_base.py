"""KnowledgeBase: documents in, scored chunks out; the component the Pipeline wraps.

It owns the chunker, the embedder, the reranker and the collections (``rag.ingestion.collection``:
each with its own chunk store, FAISS ``VectorIndex`` and ``BM25Index``), and keeps them in step:
adding a document to a collection chunks it, embeds only chunks it has not seen (ids are content
addresses), and indexes them in that collection's FAISS and BM25; re-adding an unchanged document
does nothing; a changed one replaces its chunks; deleting removes them from every index. A search
names the collections it may read (default: all) and touches only their indexes. ``save`` writes
one crash-safe version directory (``rag.ingestion.persist``), no pickle anywhere.

Example:
    >>> from rag import Document, KnowledgeBase, RAGConfig
    >>> kb = KnowledgeBase()                                   # bundled embedder, in memory
    >>> kb.add_documents([Document(id="a", text="The pass statement does nothing.")])  # doctest: +SKIP
    ['a']
    >>> kb.add_documents([Document(id="a", text="Bob's notes.")], collection="bob")    # doctest: +SKIP
    ['a']
    >>> [h.doc_id for h in kb.search("which statement does nothing?", top_k=1, collections=["default"])]  # doctest: +SKIP
    ['a']
    >>> kb.save("/tmp/kb"); kb2 = KnowledgeBase.load("/tmp/kb")                         # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import ChainMap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.ingestion.chunking import Chunker, document_title
from rag.ingestion.collection import Collection, DocumentInfo
from rag.ingestion.index_format import (
    SavedIndex,
    check_compatible,
    collection_folders,
    read_config,
    read_index,
    write_index,
)
from rag.ingestion.loaders import LoadResult, load_paths
from rag.ingestion.persist import current_version, save_version
from rag.retrieval.diversity import DiverseRetriever
from rag.retrieval.embedder import Embedder
from rag.retrieval.factory import make_embedder, make_reranker, make_retriever
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import Reranker
from rag.retrieval.retriever import DenseRetriever, Retriever, check_query
from rag.retrieval.windows import ChunkText, WindowVectors
from rag.types import DEFAULT_COLLECTION, Chunk, Document, ScoredChunk, check_collection

__all__ = ["IngestStats", "KnowledgeBase", "SearchResult"]

_EMBED_CALL = 256  # texts per embed() call (progress granularity; the model batches inside)


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


def _digest(doc: Document) -> str:
    payload = json.dumps([doc.text, doc.model_dump(mode="json")["metadata"]], sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class KnowledgeBase:
    """Chunked, embedded, indexed documents in named collections, with dense, BM25 and hybrid search
    and reranking.

    Construct with a ``RAGConfig`` (defaults: bundled MiniLM embedder, 256/32-token chunks, hybrid
    weighted fusion); pass ``embedder``/``chunker``/``reranker`` to share or replace components (the
    config then records the embedder name and chunk sizes of the components given).
    Documents go to ``collection`` (default ``"default"``); ids are unique within a collection.
    Searches read the ``collections`` named (default: every one), each through its own indexes.
    Models load lazily (or call ``warm_up()``). All public methods are thread-safe.

    Example:
        >>> from rag import RAGConfig, load_python_reference
        >>> kb = KnowledgeBase(RAGConfig(retrieval_mode="hybrid", top_k=4))
        >>> ids = kb.add_documents(load_python_reference(), show_progress=True)   # doctest: +SKIP
        >>> kb.add_documents([Document(id="notes", text="...")], collection="alice")  # doctest: +SKIP
        >>> hits = kb.search("how do I catch two exception types?", collections=["default"])  # doctest: +SKIP
        >>> hits[0].doc_id, hits[0].collection, round(hits[0].score, 2)          # doctest: +SKIP
        ('try', 'default', 0.97)
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
        self._windows = WindowVectors(self.embedder, self.chunker)
        self._collections: dict[str, Collection] = {}
        self._saved: dict[str, tuple[Path, int]] = {}  # name -> (folder last saved to, changes then)
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
    def add_documents(
        self, docs: Iterable[Document], *, collection: str = DEFAULT_COLLECTION, show_progress: bool = False
    ) -> list[str]:
        """Add or update documents in ``collection``; return their ids in input order.

        Unchanged documents (same text and metadata) are skipped; a changed document's chunks are
        replaced (chunks whose text is unchanged keep their vectors). ValueError for a non-Document,
        a document with no text, an id given twice, or an invalid collection name. ``last_ingest``
        tells what happened.
        """
        docs = list(docs)
        name = check_collection(collection)
        self._validate(docs)
        t0 = time.perf_counter()
        with self._lock:
            coll = self._collections.get(name) or Collection(name, self._new_index)
            changed = [(doc, d) for doc in docs if coll.needs_update(doc.id, d := _digest(doc))]
            updates = sum(doc.id in coll.docs for doc, _ in changed)
            new_chunks = {doc.id: self._chunk(doc, name) for doc, _ in changed}
            to_embed = [c for chunks in new_chunks.values() for c in chunks if self._must_embed(coll, c)]
            vectors = self._embed([self.search_text(c) for c in to_embed], show_progress)
            windows = self._windows.embed(to_embed) if self.keeps_windows and to_embed else None
            removed = sum(coll.replace(doc, digest, new_chunks[doc.id]) for doc, digest in changed)
            coll.index_new(to_embed, vectors, [self.search_text(c) for c in to_embed], windows)
            self._collections.setdefault(name, coll)
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
        self,
        paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        collection: str = DEFAULT_COLLECTION,
        show_progress: bool = False,
    ) -> LoadResult:
        """Load files/folders (``rag.ingestion.loaders.load_paths``) into ``collection``; the result
        lists what was skipped."""
        check_collection(collection)
        result = load_paths(paths)
        self.add_documents(result.documents, collection=collection, show_progress=show_progress)
        return result

    def delete_document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> bool:
        """Remove a document of ``collection`` and its chunks from every index; False if there was
        no such document there."""
        with self._lock:
            coll = self._collections.get(check_collection(collection))
            return coll is not None and coll.delete(doc_id)

    def get_document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> Document | None:
        """The document stored under ``doc_id`` in ``collection``, or None."""
        with self._lock:
            coll = self._collections.get(check_collection(collection))
            return coll.get(doc_id) if coll is not None else None

    def list_documents(self, collections: Iterable[str] | None = None) -> list[DocumentInfo]:
        """Id, collection, metadata and size of every document in ``collections`` (default: all),
        collection by collection, each in insertion order."""
        with self._lock:
            return [info for coll in self._select(collections) for info in coll.infos()]

    def chunks_of(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> list[Chunk]:
        """A document's chunks in text order (empty if unknown)."""
        with self._lock:
            coll = self._collections.get(check_collection(collection))
            return coll.chunks_of(doc_id) if coll is not None else []

    def collections(self) -> list[str]:
        """Names of the collections holding at least one document, in creation order."""
        with self._lock:
            return [name for name, coll in self._collections.items() if len(coll)]

    def collection(self, name: str) -> Collection | None:
        """The named collection's documents, chunks and indexes, or None (to inspect: change them only
        through the KnowledgeBase, which keeps them in step)."""
        return self._collections.get(check_collection(name))

    def count(self, collections: Iterable[str] | None = None) -> int:
        """Documents in ``collections`` (default: all)."""
        with self._lock:
            return sum(len(coll) for coll in self._select(collections))

    def __len__(self) -> int:
        return self.count()

    def __contains__(self, doc_id: object) -> bool:
        """Whether any collection holds a document with this id."""
        return any(doc_id in coll.docs for coll in list(self._collections.values()))

    @property
    def n_chunks(self) -> int:
        return sum(coll.n_chunks for coll in list(self._collections.values()))

    # -- search -----------------------------------------------------------------------------------
    def search(
        self,
        query: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        rerank: bool | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> list[ScoredChunk]:
        """The ``top_k`` best chunks of ``collections`` (default: all) for ``query``: first-stage
        ``mode`` then (if enabled) the reranker.

        Defaults come from the config (``top_k``, ``retrieval_mode``, ``reranker``).
        """
        return self.search_timed(query, top_k, mode, rerank, collections=collections).hits

    def search_timed(
        self,
        query: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        rerank: bool | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> SearchResult:
        """``search`` that also reports how long the first stage and the reranker took."""
        top_k = self.config.resolve_top_k(top_k)
        check_query(query, top_k)
        use_reranker = self.config.reranker != "none" if rerank is None else rerank
        t0 = time.perf_counter()
        depth = max(top_k, self.config.rerank_candidates) if use_reranker else top_k
        hits = self.retrieve(query, depth, mode, collections=collections)
        t1 = time.perf_counter()
        if use_reranker:
            hits = self.rerank(query, hits, top_k)
        t2 = time.perf_counter()
        return SearchResult(hits, retrieve_ms=1000 * (t1 - t0), rerank_ms=1000 * (t2 - t1))

    def retrieve(
        self,
        query: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> list[ScoredChunk]:
        """First-stage retrieval only (no reranking) over ``collections`` (default: all), best first."""
        top_k = self.config.resolve_top_k(top_k)
        check_query(query, top_k)
        with self._lock:
            return self.retriever(mode, collections=collections).retrieve(query, top_k)

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int | None = None) -> list[ScoredChunk]:
        """Apply the configured reranker to first-stage hits."""
        top_k = self.config.resolve_top_k(top_k)
        check_query(query, top_k)
        with self._lock:
            return self.reranker.rerank(query, hits, top_k)

    def similarity(
        self, query: str, chunk_ids: Sequence[str], *, collections: Iterable[str] | None = None
    ) -> dict[str, float]:
        """Cosine similarity of ``query`` with each chunk's embedding, in [-1, 1]: unlike a fused or
        reranked score it does not depend on the other candidates (``Source.score`` reports it)."""
        dense = self.retriever("dense", collections=collections)
        if isinstance(dense, DiverseRetriever):  # diversity reorders results; the scores are the inner's
            dense = dense.inner
        assert isinstance(dense, DenseRetriever)
        return dense.score(query, chunk_ids)

    def retriever(
        self,
        mode: RetrievalMode | None = None,
        fusion: Fusion | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> Retriever:
        """The first-stage retriever for ``mode`` (default: the config's) over ``collections``
        (default: all); ``fusion`` overrides the config's for hybrid mode. One collection is searched
        through its own indexes, several through federated views of theirs."""
        with self._lock:
            selected = self._select(collections)
        cfg, embedder = self.config, self.embedder
        if len(selected) == 1:
            one = selected[0]
            return make_retriever(cfg, embedder, one.index, one.bm25, one.chunks, mode=mode, fusion=fusion)
        index = FederatedIndex([c.index for c in selected])
        bm25 = FederatedBM25([c.bm25 for c in selected])
        chunks = ChainMap(*[c.chunks for c in selected])
        return make_retriever(cfg, embedder, index, bm25, chunks, mode=mode, fusion=fusion)

    @property
    def reranker(self) -> Reranker:
        """The reranker: the one passed in, else the one the config names."""
        if self._reranker is None:
            self._reranker = make_reranker(self.config, self.embedder, self.chunker, windows=self)
        return self._reranker

    @property
    def keeps_windows(self) -> bool:
        """Whether indexing a chunk also embeds its windows (the configured reranker reads them)."""
        return self.config.reranker == "embedding"

    def window_vectors(self, chunks: Sequence[ChunkText]) -> list[np.ndarray]:
        """Each chunk's window vectors (``rag.retrieval.windows``), as computed when it was indexed; a
        chunk without them (an index saved before they existed) gets them now, kept for the next
        time and written by the next save."""
        with self._lock:
            owners = [self._owner(c) for c in chunks]
            missing: dict[str, tuple[Collection, ChunkText]] = {}
            for chunk, coll in zip(chunks, owners, strict=True):
                if chunk.chunk_id not in coll.windows:
                    missing.setdefault(chunk.chunk_id, (coll, chunk))
            if missing:
                self._keep_windows(list(missing.values()))
            return [coll.windows[c.chunk_id] for c, coll in zip(chunks, owners, strict=True)]

    def fill_windows(self, *, show_progress: bool = False) -> int:
        """Compute the window vectors every chunk lacks (an index saved without them); returns how
        many chunks got theirs (a save then writes them)."""
        with self._lock:
            missing = [(coll, c) for coll in self._collections.values() for c in coll.chunks.values()
                       if c.chunk_id not in coll.windows]  # fmt: skip
            for i in range(0, len(missing), _EMBED_CALL):
                self._keep_windows(missing[i : i + _EMBED_CALL], show_progress)
            return len(missing)

    def search_text(self, chunk: Chunk) -> str:
        """What is embedded and BM25-indexed for a chunk: its text, after its title when configured."""
        title = chunk.metadata.get("title") if self.config.title_in_embedding else None
        if not title or chunk.text.startswith(title):
            return chunk.text
        return f"{title}\n\n{chunk.text}"

    # -- persistence ------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str] | None = None) -> Path:
        """Write every collection into a new version under ``directory`` (default:
        ``config.index_dir``), atomically; return the version directory. The previous version stays
        loadable until the new one is complete; collections unchanged since it are hard-linked."""
        target = directory if directory is not None else self.config.index_dir
        if target is None:
            raise ValueError("save needs a directory (argument or RAGConfig.index_dir), got None")
        root = Path(target).expanduser()
        with self._lock:
            folders: dict[str, str] = {}
            version = save_version(root, lambda tmp: folders.update(self._write(tmp, root)))
            self._remember(version, folders)
            return version

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
        """Load the current version saved under ``directory`` (an index saved before collections
        existed loads as the collection ``"default"``).

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
        kb._remember(version, {name: folder.name for name, folder in collection_folders(version).items()})
        return kb

    # -- internals --------------------------------------------------------------------------------
    def _select(self, names: Iterable[str] | None) -> list[Collection]:
        """The existing collections among ``names`` (all when None), each once; names are validated."""
        if names is None:
            return list(self._collections.values())
        if isinstance(names, str):
            raise ValueError(f"collections must be a list of names, got the string {names!r}")
        wanted = dict.fromkeys(check_collection(n) for n in names)
        return [self._collections[n] for n in wanted if n in self._collections]

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

    def _chunk(self, doc: Document, collection: str) -> list[Chunk]:
        title = document_title(doc)
        chunks = self.chunker.split(doc, collection)
        if title:
            chunks = [c.model_copy(update={"metadata": {**c.metadata, "title": title}}) for c in chunks]
        return chunks

    def _owner(self, chunk: ChunkText) -> Collection:
        """The collection holding ``chunk`` (by its ``collection``, else the one that has its id)."""
        name = getattr(chunk, "collection", None)
        coll = self._collections.get(name) if isinstance(name, str) else None
        if coll is not None and chunk.chunk_id in coll.chunks:
            return coll
        for coll in self._collections.values():
            if chunk.chunk_id in coll.chunks:
                return coll
        raise ValueError(f"chunk {chunk.chunk_id!r} is in no collection of this knowledge base")

    def _keep_windows(
        self, pairs: Sequence[tuple[Collection, ChunkText]], show_progress: bool = False
    ) -> None:
        vectors = self._windows.embed([chunk for _, chunk in pairs], show_progress=show_progress)
        for (coll, chunk), v in zip(pairs, vectors, strict=True):
            coll.set_windows([chunk.chunk_id], [v])

    def _must_embed(self, coll: Collection, chunk: Chunk) -> bool:
        old = coll.chunks.get(chunk.chunk_id)
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

    def _new_index(self) -> VectorIndex:
        cfg = self.config
        return VectorIndex(self.embedder.dim, kind=cfg.index_kind, hnsw_threshold=cfg.hnsw_threshold)

    def _write(self, directory: Path, root: Path) -> dict[str, str]:
        """Write a version into ``directory``; link the files of collections unchanged since the
        version now live under ``root``. Returns each collection's folder name."""
        try:
            live = collection_folders(current_version(root))
        except FileNotFoundError:
            live = {}
        unchanged = {
            name: folder
            for name, folder in live.items()
            if name in self._collections
            and self._saved.get(name) == (folder, self._collections[name].changes)
        }
        return write_index(
            directory, self.config, list(self._collections.values()), unchanged, self._windows.settings
        )

    def _remember(self, version: Path, folders: dict[str, str]) -> None:
        """Record which folder of ``version`` holds each collection as it is now."""
        self._saved = {
            name: (version / folder, self._collections[name].changes)
            for name, folder in folders.items()
            if name in self._collections
        }

    def _adopt(self, saved: SavedIndex) -> None:
        self._collections = {}
        for part in saved.collections:
            coll = Collection(part.name, self._new_index)
            same = part.window_settings == self._windows.settings  # else computed again when needed
            coll.adopt(
                part.records, part.chunks, part.index, self.search_text, part.windows if same else None
            )
            self._collections[part.name] = coll
