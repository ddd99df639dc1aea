"""The document stores at scale (a section of `prefixrag bench-collections`): the local index directory
against PostgreSQL shared by replicas.

A synthetic knowledge base (``chunks`` unit vectors of ``dim`` dimensions, ``chunks_per_doc`` per
document, documents spread evenly over ``collections``; the stores' costs do not depend on what the
vectors mean) is written through each store, then:

- ingest throughput: chunks per second written and acknowledged, ``docs_per_write`` documents per
  write (one version saved per write for the local directory, one transaction for PostgreSQL);
- catch-up: a new replica opening the store, every chunk loaded into its FAISS and BM25 indexes
  (the local directory: the same load from its files);
- follow latency: a writer replica adds single documents at ``write_rate_hz`` while a follower
  replica polls its own indexes; latency is from the writer's acknowledgement to the document being
  searchable on the follower (p50, p95, max);
- search: dense search of one collection (``top_k``) on the indexes each store filled, side by side in
  a rotating order, and on the follower while it follows the write load: the search path is the same
  in-memory FAISS whichever store filled it.

Example:
    >>> results = run_store_bench(StoreBenchConfig(chunks=600, collections=3), url)   # doctest: +SKIP
    >>> results["catch_up"]["postgresql"]["chunks"]                                     # doctest: +SKIP
    600
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.benchmark.stats import summarize
from rag.config import RAGConfig
from rag.retrieval.index import VectorIndex
from rag.stores.indexes import SearchIndexes
from rag.stores.local import LocalStore
from rag.stores.protocol import ChunkRecord, DocumentStore, DocumentWrite
from rag.types import Chunk, Document


@dataclass(frozen=True)
class StoreBenchConfig:
    """Sizes of the synthetic corpus and of the write load."""

    chunks: int = 100_000
    collections: int = 50
    chunks_per_doc: int = 10
    dim: int = 384
    docs_per_write: int = 50
    follow_writes: int = 200
    write_rate_hz: float = 20.0
    queries: int = 200
    top_k: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.collections < 1 or self.chunks < self.collections * self.chunks_per_doc:
            raise ValueError(
                f"need >= 1 collection of >= 1 document: {self.chunks} chunks, {self.collections} "
                f"collections, {self.chunks_per_doc} chunks per document"
            )
        if min(self.docs_per_write, self.follow_writes, self.queries, self.top_k, self.dim) < 1:
            raise ValueError("docs_per_write, follow_writes, queries, top_k and dim must be positive")
        if self.write_rate_hz <= 0:
            raise ValueError(f"write_rate_hz must be > 0, got {self.write_rate_hz}")


def measure_stores(
    config: StoreBenchConfig, url: str | None = None, progress: Callable[[str], Any] = print
) -> dict[str, Any]:
    """``run_store_bench`` on ``url``, else on a private PostgreSQL started for it (or why not)."""
    if url is not None:
        return run_store_bench(config, url, progress)
    from rag.deploy.postgres import PostgresNotFound, PrivatePostgres

    try:
        server = PrivatePostgres().start()
    except (PostgresNotFound, RuntimeError) as exc:
        return {"skipped": str(exc)}
    try:
        return run_store_bench(config, server.create_database("store_bench"), progress)
    finally:
        server.stop()


def run_store_bench(
    config: StoreBenchConfig, url: str, progress: Callable[[str], Any] = print
) -> dict[str, Any]:
    """Measure both stores (PostgreSQL at ``url``, an empty database) and return every figure."""
    from rag.stores.postgres import PostgresStore

    rng = np.random.default_rng(config.seed)
    writes = _corpus(config, rng)
    results: dict[str, Any] = {"config": asdict(config), "ingest": {}, "catch_up": {}}
    with tempfile.TemporaryDirectory(prefix="prefixrag-store-bench-") as tmp:
        directory = Path(tmp) / "index"
        progress(f"ingesting {config.chunks:,} chunks through the local index directory ...")
        local = _open(LocalStore(directory), config.dim)[0]
        results["ingest"]["local"] = _ingest(local, writes, config)
        local.close()  # and its indexes go: only the reloaded copy is searched
        progress(f"ingesting {config.chunks:,} chunks through PostgreSQL ...")
        writer = _open(PostgresStore(url), config.dim)[0]
        results["ingest"]["postgresql"] = _ingest(writer, writes, config)
        progress("catch-up: a new replica loads everything ...")
        reloaded, results["catch_up"]["local"] = _catch_up(lambda: LocalStore(directory), config.dim)
        follower, results["catch_up"]["postgresql"] = _catch_up(lambda: PostgresStore(url), config.dim)
        progress("search side by side, then follow latency under a write load ...")
        queries = _queries(config, rng)
        results["search"] = _search_side_by_side(
            {"local index": reloaded[1], "postgresql follower": follower[1]}, queries, config
        )
        results["follow"] = _follow(writer, follower[1], queries, config, rng)
        for store in (reloaded[0], follower[0], writer):
            store.close()
    return results


# ---- corpus -------------------------------------------------------------------------------------


def _corpus(config: StoreBenchConfig, rng: np.random.Generator) -> list[DocumentWrite]:
    n_docs = config.chunks // config.chunks_per_doc
    vectors = rng.standard_normal((n_docs * config.chunks_per_doc, config.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    per = config.chunks_per_doc
    return [
        _document(f"c{d % config.collections}", f"doc-{d}", vectors[d * per : (d + 1) * per])
        for d in range(n_docs)
    ]


def _document(collection: str, doc_id: str, vectors: np.ndarray) -> DocumentWrite:
    records = []
    for j, row in enumerate(vectors):
        text = f"part {j} of {doc_id} in {collection}"
        chunk = Chunk(
            doc_id=doc_id, chunk_id=f"{collection}:{doc_id}:{j}", text=text, start=0, end=len(text),
            n_tokens=len(text.split()), collection=collection,
        )  # fmt: skip
        records.append(ChunkRecord(chunk, row[None, :]))
    doc = Document(id=doc_id, text=f"synthetic document {doc_id}")
    return DocumentWrite(collection, doc, f"digest-{doc_id}", tuple(records))


def _indexes(dim: int) -> SearchIndexes:
    return SearchIndexes(lambda d: VectorIndex(d, kind="auto"), lambda: dim, lambda c: c.text)


def _open(store: DocumentStore, dim: int) -> tuple[DocumentStore, SearchIndexes]:
    store.check_config(RAGConfig())
    indexes = _indexes(dim)
    store.attach(indexes)
    return store, indexes


# ---- measurements -------------------------------------------------------------------------------


def _ingest(store: DocumentStore, writes: list[DocumentWrite], config: StoreBenchConfig) -> dict[str, Any]:
    """Chunks per second written and acknowledged, one collection's documents per write."""
    by_collection: dict[str, list[DocumentWrite]] = {}
    for w in writes:
        by_collection.setdefault(w.collection, []).append(w)
    batches = [
        docs[i : i + config.docs_per_write]
        for docs in by_collection.values()
        for i in range(0, len(docs), config.docs_per_write)
    ]
    t0 = time.perf_counter()
    per_write = []
    for batch in batches:
        t = time.perf_counter()
        store.write(batch)
        per_write.append(1000 * (time.perf_counter() - t))
    seconds = time.perf_counter() - t0
    chunks = sum(len(w.chunks) for w in writes)
    return {
        "chunks": chunks,
        "seconds": seconds,
        "chunks_per_s": chunks / seconds,
        "writes": len(batches),
        "write_ms": summarize(per_write),
    }


def _catch_up(
    make: Callable[[], DocumentStore], dim: int
) -> tuple[tuple[DocumentStore, SearchIndexes], dict[str, float]]:
    t0 = time.perf_counter()
    store, indexes = _open(make(), dim)
    seconds = time.perf_counter() - t0
    chunks = sum(c.n_chunks for c in indexes.collections.values())
    return (store, indexes), {"chunks": chunks, "seconds": seconds, "chunks_per_s": chunks / seconds}


def _queries(config: StoreBenchConfig, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    vectors = rng.standard_normal((config.queries, config.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [(f"c{i % config.collections}", v) for i, v in enumerate(vectors)]


def _search_ms(indexes: SearchIndexes, collection: str, query: np.ndarray, k: int) -> float:
    t = time.perf_counter()
    with indexes.lock:  # as the knowledge base searches: under its indexes' lock
        coll = indexes.get(collection)
        assert coll is not None
        coll.index.search(query, k)
    return 1000 * (time.perf_counter() - t)


def _search_side_by_side(
    targets: dict[str, SearchIndexes], queries: list[tuple[str, np.ndarray]], config: StoreBenchConfig
) -> dict[str, dict[str, float]]:
    names = list(targets)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i, (collection, query) in enumerate(queries):
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotating order
            times[name].append(_search_ms(targets[name], collection, query, config.top_k))
    return {name: summarize(ms) for name, ms in times.items()}


def _follow(
    writer: DocumentStore,
    follower: SearchIndexes,
    queries: list[tuple[str, np.ndarray]],
    config: StoreBenchConfig,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Single-document writes at a steady rate through ``writer``; when each turns up searchable on
    ``follower``; and the follower's search latency meanwhile."""
    acked: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = threading.Event()
    vectors = rng.standard_normal((config.follow_writes, config.chunks_per_doc, config.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=2, keepdims=True)

    def write_load() -> None:
        for i in range(config.follow_writes):
            due = t_start + i / config.write_rate_hz
            time.sleep(max(0.0, due - time.perf_counter()))
            doc = _document("c0", f"follow-{i}", vectors[i])
            writer.write([doc])
            acked[doc.document.id] = time.perf_counter()
        done.set()

    def watch() -> None:
        pending = [f"follow-{i}" for i in range(config.follow_writes)]
        while pending:
            coll = follower.get("c0")
            with follower.lock:
                arrived = [d for d in pending if coll is not None and d in coll.docs]
            now = time.perf_counter()
            for d in arrived:
                seen[d] = now
            pending = [d for d in pending if d not in seen]
            if done.is_set() and pending and now - max(acked.values(), default=now) > 10:
                break  # a write that never arrives is reported as missing, not waited for forever
            time.sleep(0.0005)

    t_start = time.perf_counter()
    threads = [threading.Thread(target=write_load), threading.Thread(target=watch)]
    for t in threads:
        t.start()
    searching: list[float] = []
    while not done.is_set():
        collection, query = queries[len(searching) % len(queries)]
        searching.append(_search_ms(follower, collection, query, config.top_k))
        time.sleep(0.002)
    for t in threads:
        t.join(60)
    # from the writer's acknowledgement; a follower that applied it first counts 0
    latency = [1000 * max(0.0, seen[d] - acked[d]) for d in acked if d in seen]
    return {
        "writes": len(acked),
        "missing": len(acked) - len(latency),
        "latency_ms": summarize(latency),
        "search_during_ms": summarize(searching),
    }
