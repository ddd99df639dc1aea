"""The answer-quality section's questions as the pipeline sees them: each item's ranked chunks, and
the slice of the QA set a run uses.

A corpus item's chunks are what the knowledge base retrieves for its question (best first); a
synthetic item's are its fact chunks at their positions among its distractor chunks, ranked in that
order, so ``relevance`` order puts the fact where the item says. A run takes ``count`` items spread
over the kinds as the set holds them (synthetic facts over every position), in a seeded stream order.

Example:
    >>> items = select_items(load_qa_set(), 12, seed=0)           # doctest: +SKIP
    >>> ranked = rank_items(items, kb, top_k=4)                    # doctest: +SKIP
    >>> [h.doc_id for h in ranked[0].hits]                         # doctest: +SKIP
    ['society-17', 'function', 'lists', 'try']
"""

from __future__ import annotations

import random
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from rag.evaluation.qa_set import KINDS, QAItem
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.rerank import EmbeddingReranker, Reranker
from rag.types import ScoredChunk


@dataclass(frozen=True)
class RankedItem:
    """A QA item and the chunks its prompt is built from, best-ranked first."""

    item: QAItem
    hits: tuple[ScoredChunk, ...]


def select_items(items: Sequence[QAItem], count: int, seed: int = 0) -> list[QAItem]:
    """``count`` items (all when it is larger), each kind in its share of the set, then shuffled.
    Synthetic items cycle through positions and templates in file order, so a kind's first ones are
    balanced; corpus items are taken evenly through the topics."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    by_kind: dict[str, list[QAItem]] = defaultdict(list)
    for item in items:
        by_kind[item.kind].append(item)
    quotas = _quotas({k: len(by_kind[k]) for k in KINDS if by_kind[k]}, min(count, len(items)))
    chosen = [
        item
        for kind, n in quotas.items()
        for item in (_spread(by_kind[kind], n) if kind == "corpus" else by_kind[kind][:n])
    ]
    random.Random(f"qa-stream-{seed}").shuffle(chosen)
    return chosen


def rank_items(
    items: Sequence[QAItem], kb: KnowledgeBase, top_k: int, rerank: bool | None = None
) -> list[RankedItem]:
    """Every item with its ranked chunks; ``rerank`` (None: the knowledge base's config) applies to
    the corpus items' retrieval only; ``True`` over a knowledge base without a reranker: the
    embedding reranker at the config's knobs over the window vectors (computed now where missing)."""
    reranker = _embedding_reranker(kb) if rerank and kb.config.reranker == "none" else None
    return [RankedItem(item, tuple(_hits(item, kb, top_k, rerank, reranker))) for item in items]


def _embedding_reranker(kb: KnowledgeBase) -> Reranker:
    kb.fill_windows()
    return EmbeddingReranker(kb.embedder, kb.chunker, weight=kb.config.rerank_weight, source=kb)


def unique_chunks(ranked: Sequence[RankedItem]) -> list[ScoredChunk]:
    """Each chunk the items use, once, in first-use order (what warming prefills)."""
    seen: dict[tuple[str, str], ScoredChunk] = {}
    for r in ranked:
        for hit in r.hits:
            seen.setdefault((hit.doc_id, hit.chunk_id), hit)
    return list(seen.values())


def _hits(
    item: QAItem, kb: KnowledgeBase, top_k: int, rerank: bool | None, reranker: Reranker | None
) -> list[ScoredChunk]:
    if item.kind == "corpus" and reranker is not None:
        first = kb.search(item.question, max(top_k, kb.config.rerank_candidates), rerank=False)
        return reranker.rerank(item.question, first, top_k)
    if item.kind == "corpus":
        return kb.search(item.question, top_k, rerank=rerank)
    distractors = iter(_distractor(kb, topic, index) for topic, index in item.distractors)
    facts = iter(item.facts)
    chunks = []
    for position in range(1, item.chunks + 1):
        if position in item.positions:
            fact = next(facts)
            chunks.append(
                ScoredChunk(
                    doc_id=fact.doc_id, chunk_id=f"{item.id}:{fact.doc_id}", text=fact.text, score=0.0
                )
            )
        else:
            chunks.append(next(distractors))
    n = len(chunks)
    return [c.model_copy(update={"score": 1.0 - rank / n}) for rank, c in enumerate(chunks)]


def _distractor(kb: KnowledgeBase, topic: str, index: int) -> ScoredChunk:
    """The topic's chunk at ``index`` (its last if it has fewer); a knowledge base without the topic
    (part of the corpus only) gives one of its own chunks, chosen by the topic's name."""
    chunks = kb.chunks_of(topic)
    if chunks:
        return ScoredChunk.of(chunks[min(index, len(chunks) - 1)], 0.0)
    every = [c for info in kb.list_documents() for c in kb.chunks_of(info.id, info.collection)]
    if not every:
        raise ValueError("the knowledge base is empty: the QA set's distractors are its chunks")
    return ScoredChunk.of(every[(zlib.crc32(topic.encode()) + index) % len(every)], 0.0)


def _quotas(sizes: dict[str, int], count: int) -> dict[str, int]:
    """Largest-remainder shares of ``count`` in proportion to ``sizes``."""
    total = sum(sizes.values())
    exact = {k: count * n / total for k, n in sizes.items()}
    quotas = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - quotas[k], reverse=True)[: count - sum(quotas.values())]:
        quotas[k] += 1
    return quotas


def _spread(items: list[QAItem], n: int) -> list[QAItem]:
    """``n`` items taken evenly through ``items``."""
    return [items[i * len(items) // n] for i in range(n)] if n else []
