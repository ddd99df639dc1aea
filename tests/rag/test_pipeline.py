"""Pipeline end to end with the real embedder, FAISS, tokenizer and model."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine import Engine, EngineConfig, SamplingParams
from rag.config import RAGConfig
from rag.ingestion.chunking import Chunker
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import Pipeline
from rag.types import Document, ScoredChunk
from tests.rag.corpus import SMALL_CORPUS

FACT = Document(id="zorblax.md", text="The Zorblax project is led by Ada Brennan. Its secret code is 4417.")


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    yield eng
    eng.close()


@pytest.fixture
def pipeline(engine, embedder, llm_tokenizer) -> Pipeline:
    config = RAGConfig(max_tokens=48)
    kb = KnowledgeBase(config, embedder=embedder, chunker=Chunker(llm_tokenizer))
    p = Pipeline(config, engine=engine, knowledge_base=kb)
    p.add_documents([*SMALL_CORPUS, FACT])
    return p


def test_ask_answers_from_the_documents_with_sources(pipeline):
    ans = pipeline.ask("What is the secret code of the Zorblax project?", top_k=2, namespace="t-ask")
    assert "4417" in ans.text
    assert ans.sources[0].doc_id == "zorblax.md" or "zorblax.md" in {s.doc_id for s in ans.sources}
    assert len(ans.sources) == 2
    assert ans.usage.prompt_tokens > 0 and ans.usage.completion_tokens > 0
    t = ans.timings
    assert t.retrieve_ms > 0 and t.ttft_ms >= t.prefill_ms > 0 and t.total_ms >= t.ttft_ms


def test_second_question_reuses_the_stable_prefix(pipeline):
    first = pipeline.ask("Who leads the Zorblax project?", namespace="t-reuse")
    second = pipeline.ask("What do cats do when content?", namespace="t-reuse")
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens >= len(pipeline.assembler.stable_ids)
    again = pipeline.ask("Who leads the Zorblax project?", namespace="t-reuse")
    assert again.usage.cached_tokens == again.usage.prompt_tokens  # its KV and saved logits
    assert again.text == first.text  # reuse changes nothing


def test_tenants_do_not_share_the_cache(pipeline):
    pipeline.ask("When was the Eiffel Tower completed?", namespace="tenant-a")
    b = pipeline.ask("When was the Eiffel Tower completed?", namespace="tenant-b")
    assert b.usage.cached_tokens == 0


def test_stream_order_sources_deltas_done(pipeline):
    events = list(pipeline.stream("What does a list's pop() do?", top_k=2, namespace="t-stream"))
    kinds = [e.type for e in events]
    assert kinds[0] == "sources" and kinds[-1] == "done"
    assert set(kinds[1:-1]) <= {"delta"}
    answer = events[-1].answer
    assert "".join(e.text for e in events if e.type == "delta") == answer.text
    assert events[0].sources == answer.sources


def test_closing_a_stream_early_releases_the_cache_lock(pipeline, engine):
    stream = pipeline.stream(
        "Tell me about Paris.", namespace="t-close", params=SamplingParams(max_tokens=200)
    )
    for event in stream:
        if event.type == "delta":
            break
    stream.close()
    assert engine.cache.stats().protected_bytes == 0


def test_cache_order_reuses_more_than_relevance_order(engine, embedder, llm_tokenizer):
    """Same chunks in a different rank order: 'cache' order keeps the best-ranked chunk first
    (``BEST_CHUNK_AT``) and follows the cached prefix with the others."""
    docs = [Document(id=f"d{i}", text=f"Fact {i}: the value of item {i} is {i * 37}.") for i in range(4)]

    def run(order: str, rerank: Callable[[list[ScoredChunk]], list[ScoredChunk]]) -> tuple[int, str]:
        config = RAGConfig(max_tokens=4, chunk_order=order)
        kb = KnowledgeBase(config, embedder=embedder, chunker=Chunker(llm_tokenizer))
        p = Pipeline(config, engine=engine, knowledge_base=kb)
        p.add_documents(docs)
        ns = f"order-{order}-{rerank.__name__}"
        hits = p.retrieve("value of item 1", top_k=4)
        first = p.assemble("value of item 1", hits, ns)
        engine.generate(first.token_ids, SamplingParams(max_tokens=1), namespace=ns)
        later = rerank(hits)  # a later question ranks the same chunks differently
        second = p.assemble("value of item 2", later, ns)
        assert second.chunks[0].chunk_id == later[0].chunk_id  # the best-ranked chunk is never demoted
        cached = engine.generate(second.token_ids, SamplingParams(max_tokens=1), namespace=ns).cached_tokens
        return cached, second.chunks[0].chunk_id

    def same_best(hits: list[ScoredChunk]) -> list[ScoredChunk]:
        return [hits[0], *reversed(hits[1:])]

    def reversed_all(hits: list[ScoredChunk]) -> list[ScoredChunk]:
        return list(reversed(hits))

    assert run("cache", same_best)[0] > run("relevance", same_best)[0]
    # another best chunk goes first whatever the cache holds: then both orders reuse the same
    assert run("cache", reversed_all)[0] == run("relevance", reversed_all)[0]


def test_empty_index_still_answers(engine, embedder, llm_tokenizer):
    config = RAGConfig(max_tokens=8)
    p = Pipeline(config, engine=engine, knowledge_base=KnowledgeBase(config, embedder=embedder))
    ans = p.ask("What is 2 + 2?", namespace="empty")
    assert ans.sources == [] and ans.usage.prompt_tokens > 0


def test_save_and_load_round_trip(pipeline, engine, tmp_path):
    pipeline.save(tmp_path / "index")
    again = Pipeline.load(tmp_path / "index", engine=engine)
    assert {d.id for d in again.list_documents()} == {d.id for d in pipeline.list_documents()}
    assert again.retrieve("secret code Zorblax", top_k=1)[0].doc_id == "zorblax.md"


def test_delete_document(pipeline):
    assert pipeline.delete_document("zorblax.md")
    assert all(h.doc_id != "zorblax.md" for h in pipeline.retrieve("Zorblax secret code", top_k=4))
    assert not pipeline.delete_document("zorblax.md")


@pytest.mark.parametrize(("question", "top_k"), [("", None), ("   ", None), ("ok?", 0), ("ok?", -2)])
def test_bad_questions(pipeline, question, top_k):
    with pytest.raises(ValueError):
        pipeline.ask(question, top_k=top_k)


def test_top_k_defaults_to_the_config_and_is_checked_on_an_empty_index_too(pipeline, engine, embedder):
    assert len(pipeline.retrieve("Zorblax secret code")) == pipeline.config.top_k
    empty = Pipeline(RAGConfig(), engine=engine, knowledge_base=KnowledgeBase(embedder=embedder))
    with pytest.raises(ValueError, match="top_k must be a positive integer, got 0"):
        empty.retrieve("anything", top_k=0)


def test_a_source_scores_its_similarity_to_the_question_however_many_candidates(
    engine, embedder, llm_tokenizer
):
    """A source's score is the question-chunk cosine similarity, the same with one candidate or many
    (a normalisation over the candidates would give a lone best match the lowest score)."""
    question = "What is the secret code of the Zorblax project?"

    def source_score(docs: list[Document]) -> float:
        config = RAGConfig(max_tokens=4)
        kb = KnowledgeBase(config, embedder=embedder, chunker=Chunker(llm_tokenizer))
        p = Pipeline(config, engine=engine, knowledge_base=kb)
        p.add_documents(docs)
        sources = p.ask(question, namespace="t-score").sources
        return next(s.score for s in sources if s.doc_id == FACT.id)

    alone = source_score([FACT])
    among_many = source_score([*SMALL_CORPUS, FACT])
    expected = float(embedder.embed_query(question) @ embedder.embed([FACT.text])[0])
    assert alone == pytest.approx(expected, abs=1e-5) and alone > 0.3
    assert among_many == pytest.approx(alone, abs=1e-6)


def test_over_long_question_is_a_clear_error(pipeline):
    with pytest.raises(ValueError, match="budget"):
        pipeline.ask("why " * 9000)


def test_default_pipeline_builds_its_engine_lazily(embedder):
    p = Pipeline(RAGConfig(engine=EngineConfig(cache_bytes=1 << 20)))
    assert p._engine is None
    assert p.retrieve("anything", top_k=3) == []
