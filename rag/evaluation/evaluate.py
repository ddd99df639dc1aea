"""Retrieval evaluation on labelled questions over the bundled corpus.

Each ``EvalSetting`` is one way to retrieve: a first-stage mode and fusion, a config (diversity
and fusion knobs), optionally another vector index over the same chunks (``rag.evaluation.variants``)
and a reranker. ``evaluate`` runs every setting on every question and scores the ranked chunks
(``rag.evaluation.metrics``): recall@k and MRR with bootstrap intervals, recall@4 by question kind,
and, for the top 4, the share of relevant documents covered, how many documents they come from and
the LLM tokens they would put in the prompt. Query vectors are computed once and shared by all
settings; ``latency`` times the real thing separately.

Example:
    >>> kb = build_reference_kb(show_progress=True)                        # doctest: +SKIP
    >>> rows = evaluate(kb, load_retrieval_eval("tune"), default_settings(kb))  # doctest: +SKIP
    >>> rows[0].name, rows[0].recall[4], rows[0].intervals["recall@4"]     # doctest: +SKIP
    ('dense', 0.94, (0.9, 0.97))
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.evaluation.eval_set import EvalQuestion, read_questions
from rag.evaluation.metrics import (
    bootstrap_interval,
    distinct_documents,
    document_coverage,
    first_relevant_rank,
    hit_topic,
    mean_reciprocal_rank,
    recall_at_k,
)
from rag.evaluation.variants import KBParts, kb_parts
from rag.ingestion.loaders import load_python_reference
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.factory import make_retriever
from rag.retrieval.index import VectorIndex
from rag.retrieval.rerank import Reranker
from rag.retrieval.retriever import QueryEmbedder
from rag.types import ScoredChunk

__all__ = [
    "EvalQuestion",
    "EvalRow",
    "EvalSetting",
    "build_reference_kb",
    "default_settings",
    "evaluate",
    "hit_topic",
    "latency",
    "load_eval_questions",
    "recall_at",
    "run_setting",
]

KS = (1, 4, 10)
CONTEXT_K = 4  # the prompt's default top_k: coverage, documents and tokens are measured there


@dataclass(frozen=True)
class EvalSetting:
    """One way to retrieve. ``mode=None`` means the knowledge base's own ``search`` (its config,
    reranker included); otherwise ``make_retriever`` with ``config`` (default: the kb's) over
    ``index`` and ``bm25`` (default: the kb's), then ``reranker`` over ``rerank_candidates``
    first-stage hits.

    Example:
        >>> EvalSetting("dense, no diversity", "dense", config=RAGConfig(max_chunks_per_document=0)).mode
        'dense'
    """

    name: str
    mode: RetrievalMode | None = None
    fusion: Fusion | None = None
    reranker: Reranker | None = None
    config: RAGConfig | None = None
    index: VectorIndex | None = None
    bm25: BM25Index | None = None


@dataclass(frozen=True)
class EvalRow:
    """What one setting scored over the questions.

    Example:
        >>> row = EvalRow("dense", {1: 0.7, 4: 0.9}, ms_per_query=8.0, mrr=0.79)
        >>> row.as_dict()["recall"]
        {'1': 0.7, '4': 0.9}
    """

    name: str
    recall: dict[int, float]
    ms_per_query: float
    misses: list[str] = field(default_factory=list, repr=False)  # question ids missed at the smallest k
    mrr: float = 0.0
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    recall_by_kind: dict[str, float] = field(default_factory=dict, repr=False)  # recall@4 per kind
    coverage: float = 0.0  # share of relevant documents in the top CONTEXT_K (as many as fit)
    documents: float = 0.0  # distinct documents in the top CONTEXT_K
    context_tokens: float = 0.0  # LLM tokens of the top CONTEXT_K chunks

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able figures (the benchmark's results.json)."""
        return {
            "name": self.name,
            "recall": {str(k): v for k, v in self.recall.items()},
            "mrr": self.mrr,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "recall4_by_kind": self.recall_by_kind,
            "coverage4": self.coverage,
            "documents4": self.documents,
            "context_tokens4": self.context_tokens,
            "ms_per_query": self.ms_per_query,
        }


def load_eval_questions(path: str | Path | None = None) -> list[EvalQuestion]:
    """The project's first labelled set, ``rag/data/eval_questions.json`` (or a file of that shape)."""
    return read_questions(path if path is not None else "eval_questions.json")


def build_reference_kb(config: RAGConfig | None = None, *, show_progress: bool = False) -> KnowledgeBase:
    """A knowledge base holding the bundled corpus (``load_python_reference``)."""
    kb = KnowledgeBase(config)
    kb.add_documents(load_python_reference(), show_progress=show_progress)
    return kb


def recall_at(results: Sequence[Sequence[ScoredChunk]], questions: Sequence[EvalQuestion], k: int) -> float:
    """Share of questions with a relevant chunk among their first ``k`` hits."""
    if len(results) != len(questions):
        raise ValueError(f"got {len(results)} result lists for {len(questions)} questions")
    ranks = [first_relevant_rank(hits, q.topics) for hits, q in zip(results, questions, strict=True)]
    return recall_at_k(ranks, k)


def default_settings(kb: KnowledgeBase) -> list[EvalSetting]:
    """dense, BM25, hybrid (weighted, RRF), hybrid + embedding rerank, and the kb's default."""
    from rag.retrieval.rerank import EmbeddingReranker

    reranker = EmbeddingReranker(kb.embedder, kb.chunker, weight=kb.config.rerank_weight)
    return [
        EvalSetting("dense", "dense"),
        EvalSetting("bm25", "bm25"),
        EvalSetting("hybrid rrf", "hybrid", fusion="rrf"),
        EvalSetting("hybrid weighted", "hybrid", fusion="weighted"),
        EvalSetting("hybrid weighted + embedding rerank", "hybrid", fusion="weighted", reranker=reranker),
        EvalSetting("default (config)"),
    ]


def run_setting(
    kb: KnowledgeBase,
    setting: EvalSetting,
    query: str,
    top_k: int,
    *,
    parts: KBParts | None = None,
    embedder: QueryEmbedder | None = None,
) -> list[ScoredChunk]:
    """The hits one setting returns for one query (``embedder`` may stand in for query embedding)."""
    if setting.mode is None:
        return kb.search(query, top_k=top_k)
    parts = parts or kb_parts(kb)
    config = setting.config or kb.config
    retriever = make_retriever(
        config,
        embedder or parts.embedder,
        setting.index or parts.index,
        setting.bm25 or parts.bm25,
        parts.chunks,
        mode=setting.mode,
        fusion=setting.fusion,
    )
    if setting.reranker is None:
        return retriever.retrieve(query, top_k)
    candidates = retriever.retrieve(query, max(top_k, config.rerank_candidates))
    return setting.reranker.rerank(query, candidates, top_k)


def evaluate(
    kb: KnowledgeBase,
    questions: Sequence[EvalQuestion] | None = None,
    settings: Sequence[EvalSetting] | None = None,
    ks: Sequence[int] = KS,
    *,
    resamples: int = 2000,
    progress: Callable[[str], None] | None = None,
) -> list[EvalRow]:
    """Score each setting over the questions (defaults: the first labelled set, ``default_settings``)."""
    if not ks or min(ks) <= 0:
        raise ValueError(f"ks must be positive integers, got {list(ks)}")
    questions = list(questions) if questions is not None else load_eval_questions()
    if not questions:
        raise ValueError("questions is empty")
    parts = kb_parts(kb)
    memo = QueryVectorMemo(parts.embedder)
    memo.prefetch([q.question for q in questions])
    rows = []
    for setting in settings if settings is not None else default_settings(kb):
        t0 = time.perf_counter()
        depth = max(max(ks), CONTEXT_K)
        results = [run_setting(kb, setting, q.question, depth, parts=parts, embedder=memo) for q in questions]
        ms = 1000 * (time.perf_counter() - t0) / len(questions)
        tokens = {cid: c.n_tokens for cid, c in parts.chunks.items()}
        rows.append(score_results(setting.name, questions, results, ks, ms, tokens, resamples=resamples))
        if progress:
            progress(setting.name)
    return rows


def score_results(
    name: str,
    questions: Sequence[EvalQuestion],
    results: Sequence[Sequence[ScoredChunk]],
    ks: Sequence[int],
    ms_per_query: float,
    chunk_tokens: Mapping[str, int],
    *,
    resamples: int = 2000,
) -> EvalRow:
    """The metrics of one setting's ranked hits for each question (``chunk_tokens``: LLM tokens per chunk id)."""
    ranks = [first_relevant_rank(hits, q.topics) for hits, q in zip(results, questions, strict=True)]
    per_question = {f"recall@{k}": [float(r is not None and r <= k) for r in ranks] for k in ks}
    per_question["mrr"] = [1.0 / r if r else 0.0 for r in ranks]
    intervals = {m: bootstrap_interval(v, resamples=resamples) for m, v in per_question.items()}
    kinds = sorted({q.kind for q in questions if q.kind})
    by_kind = {
        kind: recall_at_k([r for r, q in zip(ranks, questions, strict=True) if q.kind == kind], CONTEXT_K)
        for kind in kinds
    }
    top = [hits[:CONTEXT_K] for hits in results]
    return EvalRow(
        name=name,
        recall={k: recall_at_k(ranks, k) for k in ks},
        ms_per_query=ms_per_query,
        misses=[q.id for q, r in zip(questions, ranks, strict=True) if r is None or r > min(ks)],
        mrr=mean_reciprocal_rank(ranks),
        intervals=intervals,
        recall_by_kind=by_kind,
        coverage=statistics.fmean(
            document_coverage(h, q.topics, CONTEXT_K) for h, q in zip(top, questions, strict=True)
        ),
        documents=statistics.fmean(distinct_documents(h, CONTEXT_K) for h in top),
        context_tokens=statistics.fmean(sum(chunk_tokens[hit.chunk_id] for hit in h) for h in top),
    )


def latency(
    kb: KnowledgeBase,
    setting: EvalSetting,
    questions: Sequence[EvalQuestion],
    top_k: int = CONTEXT_K,
    *,
    before_each: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Milliseconds per query of one setting: p50/p95/mean of the total, and p50 of its two parts,
    embedding the query and searching with that vector (fusion, diversity and reranking included).

    Each question is asked once, so every query is embedded afresh. ``before_each`` runs untimed
    before every query (e.g. clearing a reranker's cache to time it cold).
    """
    parts = kb_parts(kb)
    setting = _explicit(kb, setting)
    embed_ms, search_ms = [], []
    for q in questions:
        if before_each:
            before_each()
        memo = QueryVectorMemo(parts.embedder)
        t0 = time.perf_counter()
        if setting.mode != "bm25":  # BM25 alone never embeds the query
            memo.embed_query(q.question)
        t1 = time.perf_counter()
        run_setting(kb, setting, q.question, top_k, parts=parts, embedder=memo)
        t2 = time.perf_counter()
        embed_ms.append(1000 * (t1 - t0) if setting.mode != "bm25" else 0.0)
        search_ms.append(1000 * (t2 - t1))
    total = [e + s for e, s in zip(embed_ms, search_ms, strict=True)]
    return {
        "p50": float(np.percentile(total, 50)),
        "p95": float(np.percentile(total, 95)),
        "mean": statistics.fmean(total),
        "embed_p50": float(np.percentile(embed_ms, 50)),
        "search_p50": float(np.percentile(search_ms, 50)),
        "queries": len(total),
    }


def _explicit(kb: KnowledgeBase, setting: EvalSetting) -> EvalSetting:
    """``setting`` with the knowledge base's own choices spelled out (mode, fusion, reranker)."""
    if setting.mode is not None:
        return setting
    cfg = kb.config
    reranker = kb.reranker if cfg.reranker != "none" else None
    return EvalSetting(setting.name, cfg.retrieval_mode, cfg.fusion, reranker, cfg)


class QueryVectorMemo:
    """An embedder's ``embed_query`` remembered per text: every setting of an evaluation asks again.

    Example:
        >>> memo = QueryVectorMemo(Embedder())                      # doctest: +SKIP
        >>> memo.embed_query("what does pass do?") is memo.embed_query("what does pass do?")  # doctest: +SKIP
        True
    """

    def __init__(self, embedder: QueryEmbedder) -> None:
        self.embedder = embedder
        self._vectors: dict[str, np.ndarray] = {}

    def prefetch(self, texts: Sequence[str]) -> None:
        """Embed the texts not remembered yet in batches, where the embedder embeds many at once (a
        batch costs a fraction of as many single queries)."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        embed = getattr(self.embedder, "embed", None)
        if not missing or embed is None:
            return
        for text, vector in zip(missing, embed(missing), strict=True):
            vector.flags.writeable = False  # read-only, as the embedder's own query vectors
            self._vectors[text] = vector

    def embed_query(self, text: str) -> np.ndarray:
        if text not in self._vectors:
            self._vectors[text] = self.embedder.embed_query(text)
        return self._vectors[text]
