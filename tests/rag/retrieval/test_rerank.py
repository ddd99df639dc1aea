import pytest

from rag.retrieval.rerank import CrossEncoderReranker, EmbeddingReranker, NoReranker, Reranker
from rag.types import ScoredChunk


def hit(i: int, text: str, score: float) -> ScoredChunk:
    return ScoredChunk(doc_id=f"d{i}", chunk_id=f"c{i}", score=score, text=text)


FILLER = " ".join(
    f"Line {i} of an unrelated changelog mentions version numbers and dates." for i in range(40)
)


def test_no_reranker_keeps_order():
    hits = [hit(0, "a", 2.0), hit(1, "b", 1.0)]
    assert NoReranker().rerank("q", hits, 1) == hits[:1]
    assert isinstance(NoReranker(), Reranker)


def test_embedding_reranker_finds_the_buried_answer(embedder, chunker):
    reranker = EmbeddingReranker(embedder, chunker, weight=1.0)
    assert isinstance(reranker, Reranker)
    buried = FILLER + " The Eiffel Tower in Paris was completed in 1889. " + FILLER
    hits = [hit(0, FILLER, 0.9), hit(1, buried, 0.5), hit(2, "Cats purr.", 0.4)]
    out = reranker.rerank("When was the Eiffel Tower completed?", hits, top_k=2)
    assert out[0].chunk_id == "c1" and len(out) == 2  # the first stage ranked it second
    assert out[0].score >= out[1].score
    assert all(c in reranker.source for c in ("c0", "c1", "c2"))  # windows kept per chunk


def test_embedding_reranker_weight_zero_keeps_first_stage_order(embedder, chunker):
    hits = [hit(0, "Cats purr.", 0.9), hit(1, "The Eiffel Tower is in Paris.", 0.1)]
    out = EmbeddingReranker(embedder, chunker, weight=0.0).rerank("Eiffel Tower", hits, top_k=2)
    assert [h.chunk_id for h in out] == ["c0", "c1"]


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory, embedder):
    """A real (untrained, 2-layer) BERT sequence classifier saved locally: loads like any CrossEncoder."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("cross-encoder")
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=1,
    )  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(embedder.path).save_pretrained(path)
    return path


def test_cross_encoder_reranker_from_a_local_dir(tiny_cross_encoder):
    reranker = CrossEncoderReranker(tiny_cross_encoder)
    assert isinstance(reranker, Reranker)
    hits = [hit(i, text, 0.0) for i, text in enumerate(["cats purr", "python lists", "the pass statement"])]
    out = reranker.rerank("what does pass do?", hits, top_k=2)
    assert len(out) == 2 and out[0].score >= out[1].score
    assert {h.chunk_id for h in out} <= {"c0", "c1", "c2"}
    assert reranker.rerank("q", [], top_k=3) == []


def test_cross_encoder_bad_path():
    with pytest.raises(ValueError, match="not a local model directory"):
        CrossEncoderReranker("/no/such/model")


@pytest.mark.parametrize("reranker", [NoReranker(), None])
def test_top_k_must_be_positive(reranker, embedder, chunker):
    reranker = reranker or EmbeddingReranker(embedder, chunker)
    with pytest.raises(ValueError, match="top_k"):
        reranker.rerank("q", [hit(0, "a", 1.0)], top_k=0)


def test_kb_uses_the_configured_reranker(make_kb):
    from tests.rag.corpus import SMALL_CORPUS

    kb = make_kb(reranker="embedding", rerank_candidates=3)
    kb.add_documents(SMALL_CORPUS)
    assert isinstance(kb.reranker, EmbeddingReranker)
    hits = kb.search("when was the Eiffel Tower finished?", top_k=2)
    assert len(hits) == 2 and hits[0].doc_id == "paris.html"
    assert kb.search("Eiffel", top_k=1, rerank=False)[0].doc_id == "paris.html"
    timed = kb.search_timed("when was the Eiffel Tower finished?", top_k=2)
    assert timed.hits == hits and timed.retrieve_ms > 0 and timed.rerank_ms > 0


def test_asking_a_knowledge_base_without_a_reranker_to_rerank_is_an_error_not_a_no_op(make_kb):
    from tests.rag.corpus import SMALL_CORPUS

    kb = make_kb()
    kb.add_documents(SMALL_CORPUS)
    with pytest.raises(ValueError, match="no reranker"):
        kb.search("Eiffel", top_k=1, rerank=True)
    assert kb.search("Eiffel", top_k=1)[0].doc_id == "paris.html"  # the default: the first stage


def test_the_quality_sections_reranked_ranking_reranks_over_a_first_stage_default(make_kb):
    from rag.benchmark.quality_items import rank_items
    from rag.evaluation.qa_set import load_qa_set
    from tests.rag.corpus import SMALL_CORPUS

    kb = make_kb(rerank_candidates=3)
    kb.add_documents(SMALL_CORPUS)
    corpus = [i for i in load_qa_set() if i.kind == "corpus"][:3]
    reranker = EmbeddingReranker(kb.embedder, kb.chunker, weight=kb.config.rerank_weight, source=kb)
    for ranked in rank_items(corpus, kb, top_k=2, rerank=True):
        first = kb.search(ranked.item.question, top_k=3, rerank=False)
        assert list(ranked.hits) == reranker.rerank(ranked.item.question, first, top_k=2)
