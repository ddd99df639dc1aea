"""Retrieval evaluation on the labelled question set over the bundled corpus.

``rag/data/eval_questions.json`` holds hand-written questions, each with the pydoc topics whose text
answers it. recall@k is the share of questions for which at least one of the top k chunks comes from
a relevant topic. ``evaluate`` runs every setting (retrieval mode, fusion, reranker) over one
knowledge base and returns one row per setting.

Example:
    >>> kb = build_reference_kb(show_progress=True)                 # doctest: +SKIP
    >>> for row in evaluate(kb): print(row)                         # doctest: +SKIP
    EvalRow(name='dense', recall={1: 0.76, 4: 0.95}, ms_per_query=21.0)
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from rag.config import Fusion, RAGConfig, RetrievalMode
from rag.ingestion.documents import ScoredChunk
from rag.ingestion.loaders import load_python_reference
from rag.ingestion.store import KnowledgeBase
from rag.retrieval.rerank import Reranker


@dataclass(frozen=True)
class EvalQuestion:
    """A question and the topics (document ids of the bundled corpus) that answer it."""

    id: str
    question: str
    topics: frozenset[str]


@dataclass(frozen=True)
class EvalSetting:
    """One line of the evaluation table: a first-stage mode, optional fusion override, optional reranker.

    ``mode=None`` means "whatever the knowledge base's config does" (``kb.search``), reranker included.
    """

    name: str
    mode: RetrievalMode | None = None
    fusion: Fusion | None = None
    reranker: Reranker | None = None


@dataclass(frozen=True)
class EvalRow:
    """recall@k for each k, and the mean latency per query."""

    name: str
    recall: dict[int, float]
    ms_per_query: float
    misses: list[str] = field(default_factory=list, repr=False)  # question ids missed at the smallest k


def load_eval_questions(path: str | Path | None = None) -> list[EvalQuestion]:
    """The labelled set shipped in ``rag/data/eval_questions.json`` (or another file of that shape)."""
    if path is None:
        text = resources.files("rag").joinpath("data/eval_questions.json").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    items = json.loads(text)["questions"]
    return [EvalQuestion(q["id"], q["question"], frozenset(q["topics"])) for q in items]


def build_reference_kb(config: RAGConfig | None = None, *, show_progress: bool = False) -> KnowledgeBase:
    """A knowledge base holding the bundled corpus (``load_python_reference``)."""
    kb = KnowledgeBase(config)
    kb.add_documents(load_python_reference(), show_progress=show_progress)
    return kb


def hit_topic(hit: ScoredChunk) -> str:
    """The corpus topic a hit comes from (``metadata["topic"]``, else its document id)."""
    return str(hit.metadata.get("topic", hit.doc_id))


def recall_at(results: Sequence[Sequence[ScoredChunk]], questions: Sequence[EvalQuestion], k: int) -> float:
    """Share of questions with a relevant chunk among their first ``k`` hits."""
    if len(results) != len(questions):
        raise ValueError(f"got {len(results)} result lists for {len(questions)} questions")
    if not questions:
        raise ValueError("questions is empty")
    found = sum(
        any(hit_topic(h) in q.topics for h in hits[:k]) for hits, q in zip(results, questions, strict=True)
    )
    return found / len(questions)


def default_settings(kb: KnowledgeBase) -> list[EvalSetting]:
    """dense, BM25, hybrid (RRF), hybrid (weighted), hybrid + embedding rerank, and the kb's default."""
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


def run_setting(kb: KnowledgeBase, setting: EvalSetting, query: str, top_k: int) -> list[ScoredChunk]:
    """The hits one setting returns for one query."""
    if setting.mode is None:
        return kb.search(query, top_k=top_k)
    retriever = kb.retriever(setting.mode, fusion=setting.fusion)
    if setting.reranker is None:
        return retriever.retrieve(query, top_k)
    candidates = retriever.retrieve(query, max(top_k, kb.config.rerank_candidates))
    return setting.reranker.rerank(query, candidates, top_k)


def evaluate(
    kb: KnowledgeBase,
    questions: Sequence[EvalQuestion] | None = None,
    settings: Sequence[EvalSetting] | None = None,
    ks: Sequence[int] = (1, 4),
) -> list[EvalRow]:
    """recall@k of each setting over the questions (defaults: the shipped set, ``default_settings``)."""
    if not ks or min(ks) <= 0:
        raise ValueError(f"ks must be positive integers, got {list(ks)}")
    questions = list(questions) if questions is not None else load_eval_questions()
    rows = []
    for setting in settings if settings is not None else default_settings(kb):
        t0 = time.perf_counter()
        results = [run_setting(kb, setting, q.question, max(ks)) for q in questions]
        ms = 1000 * (time.perf_counter() - t0) / max(1, len(questions))
        k0 = min(ks)
        misses = [q.id for q, hits in zip(questions, results, strict=True) if recall_at([hits], [q], k0) == 0]
        rows.append(EvalRow(setting.name, {k: recall_at(results, questions, k) for k in ks}, ms, misses))
    return rows
