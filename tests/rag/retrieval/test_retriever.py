import pytest

from rag.config import RAGConfig
from rag.retrieval.diversity import DiverseRetriever
from rag.retrieval.retriever import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    Retriever,
    rrf_fusion,
    weighted_fusion,
)

QUESTIONS = {
    "what sound does a happy cat make?": "cats.md",
    "how do I add an item to a python list?": "python-lists.txt",
    "when was the Eiffel Tower finished?": "paris.html",
    "why does reusing the prompt prefix make the first token faster?": "kv-cache.md",
}


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_modes_find_the_right_document(small_kb, mode):
    for question, doc_id in QUESTIONS.items():
        hits = small_kb.search(question, top_k=2, mode=mode)
        assert hits[0].doc_id == doc_id, (mode, question, [h.doc_id for h in hits])
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_retrievers_satisfy_the_protocol_and_return_scored_chunks(small_kb, mode):
    retriever = small_kb.retriever(mode)
    assert isinstance(retriever, Retriever)
    [hit] = retriever.retrieve("Eiffel Tower", top_k=1)
    chunk = small_kb.chunks_of("paris.html")[0]
    assert (hit.doc_id, hit.chunk_id, hit.text) == ("paris.html", chunk.chunk_id, chunk.text)
    assert hit.metadata["title"] == "Paris landmarks"


def test_concrete_types(small_kb):
    # the default config caps chunks per document: each retriever comes wrapped for diversity
    assert isinstance(small_kb.retriever("dense"), DiverseRetriever)
    assert isinstance(small_kb.retriever("dense").inner, DenseRetriever)
    assert isinstance(small_kb.retriever("bm25").inner, BM25Retriever)
    hybrid = small_kb.retriever("hybrid", fusion="rrf").inner
    assert isinstance(hybrid, HybridRetriever) and hybrid.fusion == "rrf"
    assert small_kb.search("cat", top_k=1, mode="hybrid")[0].doc_id == "cats.md"


def test_top_k_larger_than_corpus(small_kb):
    assert len(small_kb.search("python list", top_k=50, mode="dense")) == 4
    assert len(small_kb.search("python list", top_k=50, mode="hybrid")) == 4


@pytest.mark.parametrize("top_k", [0, -3, 1.5, True])
def test_bad_top_k_is_a_clear_error(small_kb, top_k):
    for mode in ("dense", "bm25", "hybrid"):
        with pytest.raises(ValueError, match="top_k"):
            small_kb.search("cats", top_k=top_k, mode=mode)
        with pytest.raises(ValueError, match="top_k"):
            small_kb.retriever(mode).retrieve("cats", top_k)


def test_bad_query_and_mode(small_kb):
    with pytest.raises(ValueError, match="query"):
        small_kb.search("  ", top_k=1)
    with pytest.raises(ValueError, match="mode"):
        small_kb.search("cats", top_k=1, mode="sparse")  # type: ignore[arg-type]


def test_empty_knowledge_base_returns_nothing(make_kb):
    kb = make_kb()
    for mode in ("dense", "bm25", "hybrid"):
        assert kb.search("anything", top_k=3, mode=mode) == []


def test_weighted_fusion_normalises_each_side():
    fused = weighted_fusion([{"a": 0.9, "b": 0.5}, {"a": 0.0, "b": 12.0}], [0.7, 0.3])
    assert fused == pytest.approx({"a": 0.7, "b": 0.3})
    assert weighted_fusion([{}, {"x": 3.0}], [0.5, 0.5]) == {"x": 0.0}


def test_rrf_fusion():
    fused = rrf_fusion([["a", "b"], ["b", "c"]], [1.0, 1.0], k=60)
    assert max(fused, key=fused.__getitem__) == "b"
    assert fused["a"] == pytest.approx(1 / 61) and fused["c"] == pytest.approx(1 / 62)


def test_hybrid_rejects_bad_settings(small_kb):
    dense, lexical = small_kb.retriever("dense"), small_kb.retriever("bm25")
    cfg = RAGConfig()
    fusion = {
        "fusion": cfg.fusion,
        "dense_weight": cfg.dense_weight,
        "rrf_k": cfg.rrf_k,
        "pool": cfg.fusion_pool,
    }
    with pytest.raises(ValueError, match="fusion"):
        HybridRetriever(dense, lexical, **{**fusion, "fusion": "max"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dense_weight"):
        HybridRetriever(dense, lexical, **{**fusion, "dense_weight": 1.5})  # type: ignore[arg-type]
