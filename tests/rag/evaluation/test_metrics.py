import pytest

from rag.evaluation.metrics import (
    bootstrap_interval,
    distinct_documents,
    document_coverage,
    first_relevant_rank,
    mean_reciprocal_rank,
    recall_at_k,
)
from rag.types import ScoredChunk


def hit(doc: str, topic: str | None = None) -> ScoredChunk:
    return ScoredChunk(doc_id=doc, chunk_id=f"{doc}-c", score=1.0, text="", metadata={"topic": topic or doc})


def test_first_relevant_rank_uses_the_topic():
    hits = [hit("x"), hit("y", topic="t"), hit("t")]
    assert first_relevant_rank(hits, {"t"}) == 2
    assert first_relevant_rank(hits, {"nope"}) is None


def test_recall_and_mrr():
    ranks = [1, 2, None, 5]
    assert recall_at_k(ranks, 1) == 0.25 and recall_at_k(ranks, 4) == 0.5 and recall_at_k(ranks, 10) == 0.75
    assert mean_reciprocal_rank(ranks) == pytest.approx((1 + 0.5 + 0.2) / 4)
    with pytest.raises(ValueError, match="empty"):
        recall_at_k([], 1)


def test_coverage_and_distinct_documents():
    hits = [hit("a"), hit("a"), hit("b"), hit("c")]
    assert distinct_documents(hits, 4) == 3 and distinct_documents(hits, 2) == 1
    assert document_coverage(hits, {"a", "b", "z"}, 4) == pytest.approx(2 / 3)
    assert document_coverage(hits, {"a", "b", "c", "d", "e"}, 4) == 3 / 4  # of as many as 4 slots hold


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_questions():
    small = [1.0, 0.0] * 10
    large = small * 20
    lo, hi = bootstrap_interval(small)
    assert lo < 0.5 < hi
    lo2, hi2 = bootstrap_interval(large)
    assert lo < lo2 < 0.5 < hi2 < hi
    assert bootstrap_interval(small, seed=3) == bootstrap_interval(small, seed=3)
    assert bootstrap_interval([1.0] * 5) == (1.0, 1.0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval(small, level=1.5)
