"""KnowledgeBase: documents in, scored chunks out; the component the Pipeline wraps.

It owns the chunker, the embedder, the reranker, a document store (``rag.stores``: the local index
directory, or PostgreSQL) and the in-memory search indexes the store fills (``rag.stores.indexes``:
per collection a chunk store, FAISS ``VectorIndex`` and ``BM25Index``). Adding a document to a
collection chunks it, embeds only chunks it has not seen (ids are content addresses), and hands the
document, its chunks and all their vectors to the store as one write, which is durable and searchable
here when it returns; re-adding an unchanged document does nothing; a changed one replaces its
chunks; deleting removes them from every index. A search names the collections it may read (default:
all) and touches only their indexes. ``save`` writes one crash-safe local version directory, no
pickle anywhere.

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
import time
from collections import ChainMap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.ingestion.chunking import Chunker, document_title
from rag.ingestion.loaders import LoadResult, load_paths
from rag.query import Query, collection_names
from rag.retrieval.diversity import DiverseRetriever
from rag.retrieval.embedder import Embedder
from rag.retrieval.factory import make_embedder, make_reranker, make_retriever
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import Reranker
from rag.retrieval.retriever import DenseRetriever, QueryRetriever, Retriever
from rag.retrieval.windows import WINDOW_SET_PREFIX, ChunkText, WindowVectors, window_text
from rag.stores import DocumentStore, LocalStore, open_store
from rag.stores.collection import Collection
from rag.stores.indexes import SearchIndexes
from rag.stores.protocol import ChunkRecord, DocumentWrite
from rag.types import DEFAULT_COLLECTION, Chunk, Document, DocumentInfo, ScoredChunk, check_collection

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
        store: DocumentStore | None = None,
    ) -> None:
        cfg = config or RAGConfig()
        self.store = store if store is not None else open_store(cfg)
        cfg = self.store.check_config(cfg)
        if embedder is not None:  # the config records what the index is really built with
            cfg = cfg.model_copy(update={"embedder": embedder.model_name, "long_chunks": embedder.long_texts})
        if chunker is not None:
            cfg = cfg.model_copy(update={"chunk_size": chunker.chunk_size, "chunk_overlap": chunker.overlap})
        self.config = cfg
        self.embedder = embedder or make_embedder(cfg)
        self.chunker = chunker or Chunker(cfg.tokenizer_model, cfg.chunk_size, cfg.chunk_overlap)
        self._reranker = reranker
        self._windows = WindowVectors(self.embedder, self.chunker)
        self.indexes = SearchIndexes(self._new_index, lambda: self.embedder.dim, self.search_text)
        self._lock = self.indexes.lock
        self._retrievers: dict[tuple[str, str, tuple[str, ...] | None], QueryRetriever] = {}
        self._built_for: tuple[int, RAGConfig] | None = None  # (indexes.generation, config) they serve
        self.last_ingest = IngestStats()
        self.store.attach(self.indexes)

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
        digests = [(doc, _digest(doc)) for doc in docs]
        with self._lock:
            coll = self.indexes.get(name)
            changed = [(doc, d) for doc, d in digests if coll is None or coll.needs_update(doc.id, d)]
        new_chunks = {doc.id: self._chunk(doc, name) for doc, _ in changed}
        with self._lock:  # what this replica holds: reused, not embedded again
            coll = self.indexes.get(name)
            updates = sum(coll is not None and doc.id in coll.docs for doc, _ in changed)
            known = {
                c.chunk_id: r for chunks in new_chunks.values() for c in chunks if (r := self._known(coll, c))
            }
            removed = sum(self._stale(coll, doc.id, new_chunks[doc.id]) for doc, _ in changed)
            # an unchanged document goes to the store as held here: the store has the last word
            # (another replica may have written it since), and keeps it without a change if so
            held = {
                doc.id: w for doc, _ in digests if doc.id not in new_chunks and (w := _held(coll, doc.id))
            }
        to_embed = [c for chunks in new_chunks.values() for c in chunks if c.chunk_id not in known]
        vectors = self._embed([self.search_text(c) for c in to_embed], show_progress)
        fresh = {c.chunk_id: ChunkRecord(c, vectors[i : i + 1]) for i, c in enumerate(to_embed)}
        records = {
            doc_id: [_record(c, known, fresh) for c in chunks] for doc_id, chunks in new_chunks.items()
        }
        if self.keeps_windows:  # the reranker reads them: computed with the chunk, stored with it
            records = self._with_windows(records, show_progress)
        writes = [
            held[doc.id] if doc.id in held else DocumentWrite(name, doc, digest, tuple(records[doc.id]))
            for doc, digest in digests
        ]
        if writes:
            self.store.write(writes)
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
        return self.store.delete(check_collection(collection), doc_id)

    def get_document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> Document | None:
        """The document stored under ``doc_id`` in ``collection``, or None."""
        with self._lock:
            coll = self.indexes.get(check_collection(collection))
            return coll.get(doc_id) if coll is not None else None

    def list_documents(self, collections: Iterable[str] | None = None) -> list[DocumentInfo]:
        """Id, collection, metadata and size of every document in ``collections`` (default: all),
        collection by collection, each in insertion order."""
        with self._lock:
            return [info for coll in self._select(collections) for info in coll.infos()]

    def chunks_of(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> list[Chunk]:
        """A document's chunks in text order (empty if unknown)."""
        with self._lock:
            coll = self.indexes.get(check_collection(collection))
            return coll.chunks_of(doc_id) if coll is not None else []

    def collections(self) -> list[str]:
        """Names of the collections holding at least one document, in creation order."""
        return self.indexes.names()

    def collection(self, name: str) -> Collection | None:
        """The named collection's documents, chunks and indexes, or None (to inspect: change them only
        through the KnowledgeBase, which keeps them in step)."""
        return self.indexes.get(check_collection(name))

    def count(self, collections: Iterable[str] | None = None) -> int:
        """Documents in ``collections`` (default: all)."""
        with self._lock:
            return sum(len(coll) for coll in self._select(collections))

    def __len__(self) -> int:
        return self.count()

    def __contains__(self, doc_id: object) -> bool:
        """Whether any collection holds a document with this id."""
        return any(doc_id in coll.docs for coll in list(self.indexes.collections.values()))

    @property
    def n_chunks(self) -> int:
        return sum(coll.n_chunks for coll in list(self.indexes.collections.values()))

    # -- search -----------------------------------------------------------------------------------
    def query(
        self, query: str | Query, top_k: int | None = None, collections: Iterable[str] | None = None
    ) -> Query:
        """The checked query for a search (a ``Query`` passes as it is; then give top_k and the
        collections in it). Defaults: the config's ``top_k``, every collection."""
        if isinstance(query, Query):
            if top_k is not None or collections is not None:
                raise ValueError("a Query carries its own top_k and collections: pass them in it")
            return query
        return Query.of(query, top_k, collections, default_top_k=self.config.top_k)

    def search(
        self,
        query: str | Query,
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
        return self.run(self.query(query, top_k, collections), mode, rerank).hits

    def search_timed(
        self,
        query: str | Query,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        rerank: bool | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> SearchResult:
        """``search`` that also reports how long the first stage and the reranker took."""
        return self.run(self.query(query, top_k, collections), mode, rerank)

    def run(
        self, query: Query, mode: RetrievalMode | None = None, rerank: bool | None = None
    ) -> SearchResult:
        """Search for a checked query (``self.query(...)``, ``Query.of``): first stage, then the
        reranker when enabled (``rerank``; default: the config's). Nothing is checked again."""
        use_reranker = self.config.reranker != "none" if rerank is None else rerank
        if use_reranker and self.config.reranker == "none":
            raise ValueError(
                "rerank=True, but this knowledge base has no reranker (RAGConfig(reranker='none'))"
            )
        t0 = time.perf_counter()
        depth = max(query.top_k, self.config.rerank_candidates) if use_reranker else query.top_k
        with self._lock:
            if not any(len(c) for c in self.indexes.select(query.collections)):
                return SearchResult([], 0.0, 0.0)
            hits = self._retriever(mode, None, query.collections).search(query.deeper(depth))
        t1 = time.perf_counter()
        if use_reranker:
            with self._lock:
                hits = self.reranker.rerank(query.text, hits, query.top_k)
        t2 = time.perf_counter()
        return SearchResult(hits, retrieve_ms=1000 * (t1 - t0), rerank_ms=1000 * (t2 - t1))

    def retrieve(
        self,
        query: str | Query,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> list[ScoredChunk]:
        """First-stage retrieval only (no reranking) over ``collections`` (default: all), best first."""
        return self.run(self.query(query, top_k, collections), mode, rerank=False).hits

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int | None = None) -> list[ScoredChunk]:
        """Apply the configured reranker to first-stage hits."""
        checked = self.query(query, top_k)
        with self._lock:
            return self.reranker.rerank(checked.text, hits, checked.top_k)

    def similarity(
        self, query: str | Query, chunk_ids: Sequence[str], *, collections: Iterable[str] | None = None
    ) -> dict[str, float]:
        """Cosine similarity of ``query`` with each chunk's embedding, in [-1, 1]: unlike a fused or
        reranked score it does not depend on the other candidates (``Source.score`` reports it). A
        ``Query`` names its collections itself."""
        if isinstance(query, Query):
            text, names = query.text, query.collections
        else:
            text, names = query, None if collections is None else collection_names(collections)
        with self._lock:
            dense = self._retriever("dense", None, names)
            if isinstance(dense, DiverseRetriever):  # diversity reorders results; the scores are the inner's
                dense = dense.inner
            assert isinstance(dense, DenseRetriever)
            return dense.score(text, chunk_ids)

    def retriever(
        self,
        mode: RetrievalMode | None = None,
        fusion: Fusion | None = None,
        *,
        collections: Iterable[str] | None = None,
    ) -> Retriever:
        """The first-stage retriever for ``mode`` (default: the config's) over ``collections``
        (default: all); ``fusion`` overrides the config's for hybrid mode. One collection is searched
        through its own indexes, several through federated views of theirs. Built once per (mode,
        fusion, collections) while the set of collections stays the same."""
        names = None if collections is None else collection_names(collections)
        return self._retriever(mode, fusion, names)

    def _retriever(
        self, mode: RetrievalMode | None, fusion: Fusion | None, names: tuple[str, ...] | None
    ) -> QueryRetriever:
        cfg = self.config
        if mode is not None and mode not in ("dense", "bm25", "hybrid"):
            raise ValueError(f"mode must be 'dense', 'bm25' or 'hybrid', got {mode!r}")
        key = (mode or cfg.retrieval_mode, fusion or cfg.fusion, names)
        with self._lock:
            built = self._built_for
            if built is None or built[0] != self.indexes.generation or built[1] is not cfg:
                self._retrievers.clear()
                self._built_for = (self.indexes.generation, cfg)
            found = self._retrievers.get(key)
            if found is None:
                found = self._retrievers[key] = self._build_retriever(
                    self.indexes.select(names), mode, fusion
                )
            return found

    def _build_retriever(
        self, selected: list[Collection], mode: RetrievalMode | None, fusion: Fusion | None
    ) -> QueryRetriever:
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

    @property
    def window_set(self) -> str:
        """The name of the chunks' extra vector set holding their window vectors, as this knowledge
        base computes them (``WindowVectors.set_name``: the settings are in it)."""
        return self._windows.set_name

    def window_vectors(self, chunks: Sequence[ChunkText]) -> list[np.ndarray]:
        """Each chunk's window vectors (``rag.retrieval.windows``), as computed when it was indexed
        and stored with it. A chunk without them (indexed while no reranker read them, or saved
        before they existed) gets them now, kept in its collection in memory: a local index
        directory writes them with its next write or save; a PostgreSQL store keeps the ones its
        writers computed at ingestion, and each process fills the others in memory on first use."""
        name = self.window_set
        with self._lock:
            owners = [self._owner(c) for c in chunks]
            found: dict[str, np.ndarray] = {}
            missing: dict[str, ChunkText] = {}
            for chunk, coll in zip(chunks, owners, strict=True):
                vectors = coll.vector_set(name).get(chunk.chunk_id) if coll is not None else None
                if vectors is not None:
                    found[chunk.chunk_id] = vectors
                else:
                    missing.setdefault(chunk.chunk_id, chunk)
            if missing:
                computed = self._embed_windows(list(missing.values()), show_progress=False)
                found.update(computed)
                for coll in {id(c): c for c in owners if c is not None}.values():
                    self._keep_windows(coll, computed)
            return [found[c.chunk_id] for c in chunks]

    def fill_windows(self, *, show_progress: bool = False) -> int:
        """Compute the window vectors every chunk lacks (an index saved without them) and keep them in
        memory, as ``window_vectors`` would on first use; returns how many chunks got theirs. A save
        of a local index directory then writes them; a PostgreSQL store does not store them (its
        writers store the ones they compute at ingestion)."""
        name = self.window_set
        with self._lock:
            collections = list(self.indexes.collections.values())
            missing = [
                c
                for coll in collections
                for c in coll.chunks.values()
                if c.chunk_id not in coll.vector_set(name)
            ]
        computed = self._embed_windows(missing, show_progress)  # outside the lock: searches go on
        with self._lock:
            for coll in collections:
                self._keep_windows(coll, computed)
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
        loadable until the new one is complete; collections unchanged since it are hard-linked. A
        store bound to that directory has saved every write already: this writes a fresh version."""
        target = directory if directory is not None else self.config.index_dir
        if target is None:
            raise ValueError("save needs a directory (argument or RAGConfig.index_dir), got None")
        return self.store.save(Path(target).expanduser(), self.config)

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
        """Open the current version saved under ``directory`` (an index saved before collections
        existed loads as the collection ``"default"``); later writes are saved there.

        Without ``config`` the saved one is used. A config may change query-time settings (mode,
        top_k, reranker, ...); ingest-time ones (embedder, tokenizer, chunk sizes) must match the
        saved index, else ValueError.
        """
        store = LocalStore(directory, must_exist=True)
        config = config or store.saved_config()
        return cls(config, embedder=embedder, chunker=chunker, reranker=reranker, store=store)

    def close(self) -> None:
        """Let go of the store (a local directory's writer lock, a database's connections)."""
        self.store.close()

    # -- internals --------------------------------------------------------------------------------
    def _select(self, names: Iterable[str] | None) -> list[Collection]:
        """The existing collections among ``names`` (all when None), each once; names are validated."""
        return self.indexes.select(None if names is None else collection_names(names))

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

    def _known(self, coll: Collection | None, chunk: Chunk) -> ChunkRecord | None:
        """The vectors this replica holds for ``chunk`` (None: embed it), less window vectors that no
        longer fit it (its title changed, or computed with other settings)."""
        found = coll.known_vectors(chunk) if coll is not None else None
        if found is None or coll is None:
            return None
        same = window_text(coll.chunks[chunk.chunk_id]) == window_text(chunk)
        extra = {
            name: v
            for name, v in found.extra.items()
            if not name.startswith(WINDOW_SET_PREFIX) or (same and name == self.window_set)
        }
        return ChunkRecord(chunk, found.vectors, extra)

    def _with_windows(
        self, records: dict[str, list[ChunkRecord]], show_progress: bool
    ) -> dict[str, list[ChunkRecord]]:
        """``records`` with their window vectors: the ones reused, else computed now."""
        name = self.window_set
        lacking = [r.chunk for rs in records.values() for r in rs if name not in r.extra]
        computed = self._embed_windows(lacking, show_progress)
        return {
            doc_id: [
                r
                if name in r.extra
                else ChunkRecord(r.chunk, r.vectors, {**r.extra, name: computed[r.chunk_id]})
                for r in rs
            ]
            for doc_id, rs in records.items()
        }

    def _embed_windows(self, chunks: Sequence[ChunkText], show_progress: bool) -> dict[str, np.ndarray]:
        """Chunk id -> its window vectors [windows, dim], embedded in calls of _EMBED_CALL chunks."""
        from tqdm.auto import tqdm

        out: dict[str, np.ndarray] = {}
        if not chunks:
            return out
        with tqdm(total=len(chunks), desc="windows", unit="chunk", disable=not show_progress) as bar:
            for i in range(0, len(chunks), _EMBED_CALL):
                part = chunks[i : i + _EMBED_CALL]
                out.update((c.chunk_id, v) for c, v in zip(part, self._windows.embed(part), strict=True))
                bar.update(len(part))
        return out

    def _keep_windows(self, coll: Collection, computed: dict[str, np.ndarray]) -> None:
        """Keep the computed window vectors of ``coll``'s chunks; forget sets of other settings."""
        name = self.window_set
        for other in [n for n in coll.extra if n.startswith(WINDOW_SET_PREFIX) and n != name]:
            coll.drop_vector_set(other)
        coll.keep_vectors(name, {cid: v for cid, v in computed.items() if cid in coll.chunks})

    def _owner(self, chunk: ChunkText) -> Collection | None:
        """The collection holding ``chunk`` (by its ``collection``, else the one that has its id;
        None if none does now, e.g. deleted since it was retrieved)."""
        name = getattr(chunk, "collection", None)
        coll = self.indexes.get(name) if isinstance(name, str) else None
        if coll is not None and chunk.chunk_id in coll.chunks:
            return coll
        for coll in self.indexes.collections.values():
            if chunk.chunk_id in coll.chunks:
                return coll
        return None

    @staticmethod
    def _stale(coll: Collection | None, doc_id: str, chunks: list[Chunk]) -> int:
        """Chunks of the stored document that its new version drops."""
        old = coll.docs.get(doc_id) if coll is not None else None
        keep = {c.chunk_id for c in chunks}
        return sum(c not in keep for c in old.chunk_ids) if old else 0

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

    def _new_index(self, dim: int) -> VectorIndex:
        cfg = self.config
        return VectorIndex(dim, kind=cfg.index_kind, hnsw_threshold=cfg.hnsw_threshold)


def _held(coll: Collection | None, doc_id: str) -> DocumentWrite | None:
    return coll.record(doc_id) if coll is not None else None


def _record(chunk: Chunk, known: dict[str, ChunkRecord], fresh: dict[str, ChunkRecord]) -> ChunkRecord:
    """A chunk with its vectors: the ones already stored for it, else the ones just computed."""
    found = known.get(chunk.chunk_id)
    if found is not None:
        return ChunkRecord(chunk, found.vectors, found.extra)  # the new metadata, the same vectors
    return fresh[chunk.chunk_id]
