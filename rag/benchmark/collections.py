"""`prefixrag bench-collections`: searching one tenant's collections at scale, per-collection indexes
against one shared index filtered to the tenant's rows.

Synthetic unit vectors (the index's cost does not depend on what the vectors mean) and synthetic
Zipf-distributed texts, spread evenly over the collections. A query reads its tenant's own collection
(``own``) or that plus the shared collection (``own+shared``), and looks for a noisy copy of one of
their vectors. Every method answers every query, in a rotating order (timings side by side), and is
scored against an exact brute-force search of the allowed rows:

- ``per-collection``: what the knowledge base does (one ``VectorIndex`` per collection, several
  merged by ``FederatedIndex``); it never touches another collection's vectors.
- ``shared flat, post-filter``: one exact index over everything, asked for more and more hits until
  ``k`` of them are allowed (what a shared index without a filter must do).
- ``shared flat, IDSelector``: FAISS's own filter on that index (it still visits every row).
- ``shared HNSW, post-filter`` and ``shared HNSW, IDSelector``: the same on the graph index
  ``VectorIndex`` switches to at this size (``hnsw_threshold``).

BM25 is timed the same way: one ``BM25Index`` per collection against a shared one whose scores are
filtered to the allowed keys.

Example:
    >>> results = run_collections_bench(CollectionsBenchConfig(chunks=2_000, collections=4, queries=10))  # doctest: +SKIP
    >>> results["dense"][0]["method"], results["dense"][0]["recall"]                                    # doctest: +SKIP
    ('per-collection', 1.0)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rag.benchmark.stats import summarize
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.index import VectorIndex

Search = Callable[[np.ndarray, list[int]], list[str]]  # (query vector, allowed collections) -> keys


@dataclass(frozen=True)
class CollectionsBenchConfig:
    """Sizes of the synthetic knowledge base and of the query stream."""

    chunks: int = 100_000
    collections: int = 50
    dim: int = 384
    queries: int = 200
    top_k: int = 4
    noise: float = 0.5  # query = a stored vector + this much Gaussian noise (per unit norm)
    hnsw_threshold: int = 50_000  # VectorIndex's default: the shared index is a graph from here on
    bm25: bool = True
    threads: int = 1  # FAISS's OpenMP threads: one query at a time, as the server searches
    words_per_text: int = 40
    vocabulary: int = 20_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.collections < 2 or self.chunks < 2 * self.collections:
            raise ValueError(
                f"need >= 2 collections and >= 2 chunks each, got {self.collections}, {self.chunks}"
            )
        if self.queries < 1 or self.top_k < 1 or self.dim < 2 or self.threads < 1:
            raise ValueError("queries, top_k, threads and dim must be positive (dim >= 2)")


@dataclass
class _Corpus:
    vectors: np.ndarray  # [chunks, dim] unit rows
    owner: np.ndarray  # [chunks] collection of each row
    keys: list[str]

    def rows(self, allowed: Sequence[int]) -> np.ndarray:
        return np.flatnonzero(np.isin(self.owner, allowed))


def run_collections_bench(
    config: CollectionsBenchConfig, progress: Callable[[str], Any] = print
) -> dict[str, Any]:
    """Build the indexes, run the queries, return per-method latency and recall figures."""
    import faiss

    faiss.omp_set_num_threads(config.threads)
    rng = np.random.default_rng(config.seed)
    corpus = _corpus(config, rng)
    progress(f"building per-collection and shared indexes over {config.chunks} vectors ...")
    build: dict[str, float] = {}
    own = _timed(build, "per-collection", lambda: _per_collection(corpus, config))
    flat = _timed(build, "shared flat", lambda: _shared(corpus, config, "flat"))
    graph = _timed(build, "shared HNSW", lambda: _shared(corpus, config, "auto"))
    methods: dict[str, Search] = {
        "per-collection": lambda q, allowed: [
            k for k, _ in FederatedIndex([own[c] for c in allowed]).search(q, config.top_k)
        ],
        "shared flat, post-filter": _post_filter(flat, corpus, config.top_k),
        "shared flat, IDSelector": _selector(flat, corpus, config.top_k, faiss.SearchParameters),
        "shared HNSW, post-filter": _post_filter(graph, corpus, config.top_k),
        "shared HNSW, IDSelector": _selector(graph, corpus, config.top_k, faiss.SearchParametersHNSW),  # type: ignore[attr-defined]
    }
    progress(f"{config.queries} queries x {len(methods)} methods (side by side) ...")
    dense = _measure_dense(methods, corpus, config, rng)
    results: dict[str, Any] = {
        "config": asdict(config),
        "faiss_threads": int(faiss.omp_get_max_threads()),
        "shared_index_kind": graph.kind,
        "build_s": build,
        "dense": dense,
    }
    if config.bm25:
        progress("BM25: per-collection vs shared ...")
        results["bm25"] = _measure_bm25(corpus, config, rng)
    return results


# ---- corpus and indexes -------------------------------------------------------------------------------


def _corpus(config: CollectionsBenchConfig, rng: np.random.Generator) -> _Corpus:
    vectors = rng.standard_normal((config.chunks, config.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    owner = np.arange(config.chunks) % config.collections
    return _Corpus(vectors, owner, [f"c{o}-{i}" for i, o in enumerate(owner.tolist())])


def _per_collection(corpus: _Corpus, config: CollectionsBenchConfig) -> list[VectorIndex]:
    indexes = []
    for c in range(config.collections):
        index = VectorIndex(config.dim, hnsw_threshold=config.hnsw_threshold)
        rows = corpus.rows([c])
        index.add([corpus.keys[r] for r in rows.tolist()], corpus.vectors[rows])
        indexes.append(index)
    return indexes


def _shared(corpus: _Corpus, config: CollectionsBenchConfig, kind: str) -> VectorIndex:
    index = VectorIndex(config.dim, kind=kind, hnsw_threshold=config.hnsw_threshold)  # type: ignore[arg-type]
    index.add(corpus.keys, corpus.vectors)  # row i of the index is corpus row i
    return index


def _timed(into: dict[str, float], name: str, build: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = build()
    into[name] = time.perf_counter() - t0
    return out


def _post_filter(index: VectorIndex, corpus: _Corpus, k: int) -> Search:
    """Ask the shared index for 4k, 8k, ... hits until k of them belong to the allowed collections."""

    def search(query: np.ndarray, allowed: list[int]) -> list[str]:
        fetch = 4 * k
        ok = {f"c{c}-" for c in allowed}
        while True:
            hits = [key for key, _ in index.search(query, fetch) if key[: key.index("-") + 1] in ok]
            if len(hits) >= k or fetch >= len(corpus.keys):
                return hits[:k]
            fetch *= 2

    return search


def _selector(index: VectorIndex, corpus: _Corpus, k: int, params_type: Any) -> Search:
    """FAISS's search with an ``IDSelectorBatch`` of the allowed rows (the index's rows are corpus rows)."""
    import faiss

    def search(query: np.ndarray, allowed: list[int]) -> list[str]:
        rows = corpus.rows(allowed).astype(np.int64)
        params = params_type()
        params.sel = faiss.IDSelectorBatch(rows)
        if isinstance(params, faiss.SearchParametersHNSW):  # type: ignore[attr-defined]
            params.efSearch = index.hnsw_params["ef_search"]
        _, found = index._faiss.search(query.reshape(1, -1), k, params=params)
        return [corpus.keys[r] for r in found[0].tolist() if r >= 0]

    return search


# ---- measurements -------------------------------------------------------------------------------------


def _queries(
    corpus: _Corpus, config: CollectionsBenchConfig, rng: np.random.Generator
) -> list[tuple[np.ndarray, list[int]]]:
    """(query vector, allowed collections): a tenant's own collection, every other query with the shared
    collection (0) too; the query is near one of the allowed vectors."""
    out = []
    for i in range(config.queries):
        tenant = int(rng.integers(1, config.collections))
        allowed = [tenant] if i % 2 == 0 else [tenant, 0]
        target = int(rng.choice(corpus.rows(allowed)))
        query = corpus.vectors[target] + config.noise * rng.standard_normal(config.dim).astype(
            np.float32
        ) / np.sqrt(config.dim)
        out.append(((query / np.linalg.norm(query)).astype(np.float32), allowed))
    return out


def _measure_dense(
    methods: dict[str, Search], corpus: _Corpus, config: CollectionsBenchConfig, rng: np.random.Generator
) -> list[dict[str, Any]]:
    names = list(methods)
    seconds: dict[tuple[str, str], list[float]] = {}
    recall: dict[tuple[str, str], list[float]] = {}
    for i, (query, allowed) in enumerate(_queries(corpus, config, rng)):
        scope = "own" if len(allowed) == 1 else "own+shared"
        rows = corpus.rows(allowed)
        exact = {
            corpus.keys[r] for r in rows[np.argsort(-(corpus.vectors[rows] @ query))[: config.top_k]].tolist()
        }
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate: no method always goes first
            t0 = time.perf_counter()
            found = methods[name](query, allowed)
            seconds.setdefault((name, scope), []).append(time.perf_counter() - t0)
            recall.setdefault((name, scope), []).append(len(exact & set(found)) / config.top_k)
    return [_row(name, scope, seconds[name, scope], recall[name, scope]) for name, scope in seconds]


def _measure_bm25(
    corpus: _Corpus, config: CollectionsBenchConfig, rng: np.random.Generator
) -> list[dict[str, Any]]:
    ranks = np.arange(1, config.vocabulary + 1, dtype=np.float64)
    p = (1.0 / ranks) / (1.0 / ranks).sum()
    words = rng.choice(config.vocabulary, size=(config.chunks, config.words_per_text), p=p)
    texts = [" ".join(f"w{w}x" for w in row.tolist()) for row in words]
    per = [BM25Index() for _ in range(config.collections)]
    for c, index in enumerate(per):
        rows = corpus.rows([c]).tolist()
        index.add([corpus.keys[r] for r in rows], [texts[r] for r in rows])
    shared = BM25Index()
    shared.add(corpus.keys, texts)
    shared.search("w1x", 1)  # build both now, not inside the first timed query
    for index in per:
        index.search("w1x", 1)
    k = config.top_k
    methods: dict[str, Callable[[str, list[int], list[str]], Any]] = {
        "per-collection": lambda query, allowed, keys: FederatedBM25([per[c] for c in allowed]).search(
            query, k
        ),
        "shared, scores filtered": lambda query, allowed, keys: sorted(
            shared.score(query, keys).items(), key=lambda kv: -kv[1]
        )[:k],
    }
    names = list(methods)
    seconds: dict[tuple[str, str], list[float]] = {}
    for i in range(config.queries):
        tenant = int(rng.integers(1, config.collections))
        allowed = [tenant] if i % 2 == 0 else [tenant, 0]
        scope = "own" if len(allowed) == 1 else "own+shared"
        text = texts[int(rng.choice(corpus.rows(allowed)))].split()
        query = " ".join(text[j] for j in rng.choice(len(text), size=3, replace=False).tolist())
        keys = [corpus.keys[r] for r in corpus.rows(allowed).tolist()]
        for name in names[i % 2 :] + names[: i % 2]:
            t0 = time.perf_counter()
            methods[name](query, allowed, keys)
            seconds.setdefault((name, scope), []).append(time.perf_counter() - t0)
    return [_row(name, scope, seconds[name, scope], None) for name, scope in seconds]


def _row(name: str, scope: str, seconds: list[float], recall: list[float] | None) -> dict[str, Any]:
    ms = summarize([1000 * s for s in seconds])
    return {
        "method": name,
        "scope": scope,
        "p50_ms": ms["p50"],
        "p95_ms": ms["p95"],
        "mean_ms": ms["mean"],
        "recall": None if recall is None else float(np.mean(recall)),
        "queries": len(seconds),
    }
