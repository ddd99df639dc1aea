"""Warming the chunk placements and answering in chunks mode, with the real embedder, FAISS and model."""

from __future__ import annotations

import threading

import pytest

from engine import Engine, EngineConfig
from engine.remote import RemoteEngine
from rag.config import RAGConfig
from rag.ingestion.chunking import Chunker
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import Pipeline
from rag.types import Document
from tests.rag.corpus import SMALL_CORPUS

FACT = Document(id="zorblax.md", text="The Zorblax project is led by Ada Brennan. Its secret code is 4417.")
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M's KV in float32


def _pipeline(loaded_model, embedder, llm_tokenizer, **engine_options) -> Pipeline:
    config = RAGConfig(max_tokens=16)
    engine_config = EngineConfig(model=loaded_model.model_id, **engine_options)
    engine = Engine(
        loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=engine_config
    )
    kb = KnowledgeBase(config, embedder=embedder, chunker=Chunker(llm_tokenizer))
    pipeline = Pipeline(config, engine=engine, knowledge_base=kb)
    pipeline.add_documents([*SMALL_CORPUS, FACT])
    return pipeline


@pytest.fixture(scope="module")
def pipeline(loaded_model, embedder, llm_tokenizer):
    p = _pipeline(loaded_model, embedder, llm_tokenizer)
    yield p
    p.engine.close()  # type: ignore[attr-defined]


def test_warm_prefills_every_chunk_once(pipeline):
    first = pipeline.warm("warm-once")
    assert first.chunks == pipeline.kb.n_chunks == first.warmed
    assert first.tokens > 0 and not first.not_fitted and not first.cancelled
    asm, engine = pipeline.assembler, pipeline.engine
    for info in pipeline.kb.list_documents():
        for chunk in pipeline.kb.chunks_of(info.id, info.collection):  # both placements, whole
            for ids in (asm.placement(chunk), asm.stitch_placement(chunk)):
                assert engine.cached_prefix_length(ids, "warm-once") == len(ids)
    again = pipeline.warm("warm-once")  # resumable: what is cached is skipped
    assert again.warmed == 0 and again.already_cached == first.chunks


def test_chunks_mode_reuses_warmed_chunks_on_the_first_question(pipeline):
    pipeline.warm("chunks")
    answer = pipeline.ask(
        "What is the secret code of the Zorblax project?", top_k=3, namespace="chunks", reuse="chunks"
    )
    usage = answer.usage
    assert usage.reuse == "chunks"
    assert usage.cached_tokens >= len(pipeline.assembler.stable_ids)  # the first chunk's placement, exact
    assert usage.stitched_tokens > 0 and usage.recomputed_tokens > 0
    assert usage.cached_tokens + usage.stitched_tokens + usage.recomputed_tokens < usage.prompt_tokens
    assert usage.stitch_deviation is not None and 0 < usage.stitch_deviation < 1
    exact = pipeline.ask("What is the secret code of the Zorblax project?", top_k=3, namespace="chunks")
    assert exact.usage.reuse == "prefix" and exact.usage.stitched_tokens == 0
    assert exact.usage.stitch_deviation is None


def test_after_warming_the_best_chunk_stays_first(pipeline):
    """Behaviour change (issue 26): with every placement cached alike, the ``cache`` order keeps the
    retrieval's order (it used to put first the longest chunk, or one an earlier prompt began with);
    chunks mode lays the chunks out in relevance order whatever the cache holds."""
    pipeline.warm("order")
    for question in (
        "What is the secret code of the Zorblax project?",
        "When was the Eiffel Tower completed?",
    ):
        ranked = [h.chunk_id for h in pipeline.retrieve(question, top_k=3)]
        exact = pipeline.ask(question, top_k=3, namespace="order")
        assert [s.chunk_id for s in exact.sources] == ranked
        stitched = pipeline.ask(question, top_k=3, namespace="order", reuse="chunks")
        assert [s.chunk_id for s in stitched.sources] == ranked


def test_warmed_chunks_are_not_shared_across_tenants(pipeline):
    pipeline.warm("tenant-a")
    b = pipeline.ask("Who leads the Zorblax project?", top_k=3, namespace="tenant-b", reuse="chunks")
    assert b.usage.cached_tokens == 0 and b.usage.stitched_tokens == 0


def test_warm_stays_within_the_cache_budget(loaded_model, embedder, llm_tokenizer):
    p = _pipeline(loaded_model, embedder, llm_tokenizer, cache_bytes=600 * BYTES_PER_TOKEN, kv_slab_bytes=0)
    try:
        report = p.warm()
        assert report.warmed >= 1 and report.not_fitted
        assert report.warmed + len(report.not_fitted) == report.chunks
        stats = p.engine.cache.stats()  # type: ignore[attr-defined]
        assert stats.evictions == 0 and stats.used_bytes <= stats.capacity_bytes
    finally:
        p.engine.close()  # type: ignore[attr-defined]


def test_warm_is_cancellable_between_chunks(pipeline):
    cancel = threading.Event()
    report = pipeline.warm("cancelled", cancel=cancel, progress=lambda done, total: cancel.set())
    assert report.cancelled and report.warmed == 1


def test_bad_reuse_and_remote_chunks_are_clear_errors(pipeline):
    with pytest.raises(ValueError, match="reuse must be one of"):
        pipeline.ask("anything?", reuse="sideways")
    remote = RemoteEngine("http://127.0.0.1:9", "m", tokenizer=pipeline.engine.tokenizer)
    try:
        with pytest.raises(ValueError, match="exact prefixes only"):
            remote.stream([1, 2, 3], reuse="chunks")
    finally:
        remote.close()
