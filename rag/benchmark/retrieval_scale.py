"""Synthetic scale run: HNSW against exact search, and retrieval latency, with many chunks.

Embedding 100k real chunks would take hours on a CPU, so the chunks are synthetic but shaped like
the real ones: each vector is a real chunk vector plus a share of another real chunk vector plus
Gaussian noise (renormalised), so the vectors cluster as the corpus does; each text keeps a random
``keep_words`` share of that real chunk's words, so BM25 sees the corpus's vocabulary and term
frequencies. Queries are the eval set's real questions, embedded by the real embedder.

For each ``ef_search`` of the sweep the HNSW index answers every query and its top ``recall_k`` is
compared with the flat (exact) index's: ANN recall. The targets are judged at the index's default
``ef_search`` (chosen on the tuning split's questions), which also times the configured retriever
(hybrid, diversity, query embedding included) end to end.

Example:
    >>> out = run_scale(kb, load_retrieval_eval("heldout"), ScaleSpec(chunks=10_000))   # doctest: +SKIP
    >>> out["ef_search"], out["recall"], out["latency_ms"]["hnsw"]["p50"]            # doctest: +SKIP
    (128, 0.99, 31.2)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rag.evaluation.eval_set import EvalQuestion
from rag.evaluation.evaluate import QueryVectorMemo
from rag.evaluation.variants import KBParts, kb_parts
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.factory import make_retriever
from rag.retrieval.index import EF_CONSTRUCTION, EF_SEARCH, HNSW_M, VectorIndex
from rag.types import Chunk

MIN_ANN_RECALL = 0.98
P50_MS_TARGET = 100.0


@dataclass(frozen=True)
class ScaleSpec:
    """The synthetic corpus and the HNSW settings to measure.

    Example:
        >>> ScaleSpec(chunks=10_000).ef_search == EF_SEARCH
        True
    """

    chunks: int = 100_000
    chunks_per_document: int = 6
    mix: float = 0.5  # at most this share of a second real vector is added
    noise: float = 0.025  # per-dimension standard deviation of the added Gaussian noise
    keep_words: float = 0.7
    hnsw_m: int = HNSW_M
    ef_construction: int = EF_CONSTRUCTION
    ef_search: int = EF_SEARCH  # the one the targets are judged at
    ef_sweep: tuple[int, ...] = (16, 32, 64, 128, 256)
    recall_k: int = 10
    min_recall: float = MIN_ANN_RECALL
    top_k: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.chunks < 1 or self.chunks_per_document < 1 or self.recall_k < 1 or self.top_k < 1:
            raise ValueError(f"chunks, chunks_per_document, recall_k and top_k must be >= 1: {self}")
        if self.ef_search < 1 or not self.ef_sweep or min(self.ef_sweep) < 1:
            raise ValueError(f"ef_search and ef_sweep need positive values: {self}")
        if not 0.0 < self.keep_words <= 1.0:
            raise ValueError(f"keep_words must be in (0, 1], got {self.keep_words}")


@dataclass
class SyntheticCorpus:
    """Chunks, their vectors ([n, dim] unit rows, in ``ids`` order) and texts.

    Example:
        >>> corpus = synthetic_corpus(kb_parts(kb), ScaleSpec(chunks=1000))   # doctest: +SKIP
        >>> corpus.vectors.shape[0] == len(corpus.ids) == 1000                # doctest: +SKIP
        True
    """

    ids: list[str]
    vectors: np.ndarray
    chunks: dict[str, Chunk]


def synthetic_corpus(parts: KBParts, spec: ScaleSpec) -> SyntheticCorpus:
    """``spec.chunks`` chunks shaped like the knowledge base's (see the module docstring)."""
    rng = np.random.default_rng(spec.seed)
    base_ids = list(parts.chunks)
    if not base_ids:
        raise ValueError("the knowledge base has no chunks to shape a synthetic corpus on")
    base = np.stack([parts.index.vectors_of(cid)[0] for cid in base_ids])  # [n_base, dim]
    first = rng.integers(0, len(base_ids), spec.chunks)
    second = rng.integers(0, len(base_ids), spec.chunks)
    share = rng.uniform(0.0, spec.mix, spec.chunks)[:, None]
    vectors = base[first] + share * base[second]
    vectors += rng.normal(0.0, spec.noise, vectors.shape).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = [parts.chunks[cid].text.split() for cid in base_ids]
    ids, chunks = [], {}
    for i, b in enumerate(first.tolist()):
        source = parts.chunks[base_ids[b]]
        kept = [
            w for w, keep in zip(words[b], rng.random(len(words[b])) < spec.keep_words, strict=True) if keep
        ]
        text = " ".join(kept) or source.text
        cid = f"synthetic-{i}"
        doc = f"synthetic-doc-{i // spec.chunks_per_document}"
        chunks[cid] = Chunk(
            doc_id=doc, chunk_id=cid, text=text, start=0, end=len(text), n_tokens=source.n_tokens, metadata={}
        )
        ids.append(cid)
    return SyntheticCorpus(ids, np.ascontiguousarray(vectors, dtype=np.float32), chunks)


def run_scale(
    kb: KnowledgeBase,
    questions: Sequence[EvalQuestion],
    spec: ScaleSpec | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """ANN recall and search time per ``ef_search``, build times, and end-to-end retrieval latency."""
    spec = spec or ScaleSpec()
    say = progress or (lambda _msg: None)
    parts = kb_parts(kb)
    t0 = time.perf_counter()
    corpus = synthetic_corpus(parts, spec)
    build = {"synthesis_s": time.perf_counter() - t0}
    say(f"{spec.chunks:,} synthetic chunks")
    flat, build["flat_s"] = _timed_index(corpus, "flat", spec)
    hnsw, build["hnsw_s"] = _timed_index(corpus, "hnsw", spec)
    say("flat and HNSW indexes built")
    t0 = time.perf_counter()
    bm25 = BM25Index()
    bm25.add(corpus.ids, [corpus.chunks[cid].text for cid in corpus.ids])
    bm25.search("warm up", 1)  # builds the matrix now, not inside the first timed query
    build["bm25_s"] = time.perf_counter() - t0
    queries = [parts.embedder.embed_query(q.question) for q in questions]
    exact = [[key for key, _ in flat.search(v, spec.recall_k)] for v in queries]
    sweep = [_ann_point(hnsw, queries, exact, ef, spec.recall_k) for ef in spec.ef_sweep]
    used = _ann_point(hnsw, queries, exact, spec.ef_search, spec.recall_k)
    say("HNSW swept against exact search")
    timed = {
        kind: _retrieval_latency(kb, parts, index, bm25, corpus, questions, spec.top_k)
        for kind, index in (("hnsw", hnsw), ("flat", flat))
    }
    say("retrieval timed")
    return {
        "spec": asdict(spec),
        "build_s": build,
        "ef_sweep": sweep,
        "ef_search": spec.ef_search,
        "recall": used["recall"],
        "latency_ms": timed,
        "retriever": f"{kb.config.retrieval_mode} ({kb.config.fusion}), "
        f"max {kb.config.max_chunks_per_document} chunk(s) per document first",
        "targets": [
            {
                "target": f"HNSW recall@{spec.recall_k} vs exact >= {spec.min_recall}",
                "value": f"{used['recall']:.3f} at ef_search {spec.ef_search}",
                "met": used["recall"] >= spec.min_recall,
            },
            {
                "target": f"retrieval p50 <= {P50_MS_TARGET:.0f} ms at top-{spec.top_k} with {spec.chunks:,} chunks",
                "value": f"{timed['hnsw']['p50']:.1f} ms",
                "met": timed["hnsw"]["p50"] <= P50_MS_TARGET,
            },
        ],
    }


def _timed_index(corpus: SyntheticCorpus, kind: str, spec: ScaleSpec) -> tuple[VectorIndex, float]:
    t0 = time.perf_counter()
    index = VectorIndex(
        corpus.vectors.shape[1],
        kind="flat" if kind == "flat" else "hnsw",
        hnsw_m=spec.hnsw_m,
        ef_construction=spec.ef_construction,
    )
    index.add(corpus.ids, corpus.vectors)
    return index, time.perf_counter() - t0


def _ann_point(
    hnsw: VectorIndex, queries: Sequence[np.ndarray], exact: Sequence[list[str]], ef: int, k: int
) -> dict[str, float]:
    """ANN recall@k against exact results and the median search time at one ``ef_search``."""
    hnsw.set_ef_search(ef)
    found, times = [], []
    for vector, truth in zip(queries, exact, strict=True):
        t0 = time.perf_counter()
        got = hnsw.search(vector, k)
        times.append(1000 * (time.perf_counter() - t0))
        found.append(len({key for key, _ in got} & set(truth)) / len(truth))
    return {"ef_search": ef, "recall": statistics.fmean(found), "search_ms_p50": float(np.median(times))}


def _retrieval_latency(
    kb: KnowledgeBase,
    parts: KBParts,
    index: VectorIndex,
    bm25: BM25Index,
    corpus: SyntheticCorpus,
    questions: Sequence[EvalQuestion],
    top_k: int,
) -> dict[str, float]:
    """The configured retriever over the synthetic corpus, one fresh query embedding per question."""
    embed_ms, search_ms = [], []
    for q in questions:
        memo = QueryVectorMemo(parts.embedder)
        retriever = make_retriever(kb.config, memo, index, bm25, corpus.chunks)
        t0 = time.perf_counter()
        memo.embed_query(q.question)
        t1 = time.perf_counter()
        retriever.retrieve(q.question, top_k)
        t2 = time.perf_counter()
        embed_ms.append(1000 * (t1 - t0))
        search_ms.append(1000 * (t2 - t1))
    total = [e + s for e, s in zip(embed_ms, search_ms, strict=True)]
    return {
        "p50": float(np.percentile(total, 50)),
        "p95": float(np.percentile(total, 95)),
        "embed_p50": float(np.percentile(embed_ms, 50)),
        "search_p50": float(np.percentile(search_ms, 50)),
        "queries": len(total),
    }
