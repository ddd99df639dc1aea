"""Window vectors for the embedding reranker: computed when a chunk is indexed, kept in step with it
(its extra vector set ``KnowledgeBase.window_set``), saved with the index, and computed on first use
for an index saved without them; on a PostgreSQL store, stored by the writer that computes them."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.rerank import EmbeddingReranker
from rag.retrieval.windows import WindowCache, WindowVectors, window_set_name
from rag.types import Document
from tests.rag.corpus import SMALL_CORPUS

QUESTION = "when was the Eiffel Tower finished?"
LONG = Document(
    id="long.md",
    text=" ".join(f"Line {i} of an unrelated changelog mentions dates and versions." for i in range(60))
    + " The Zorblax gate code is 4417.",
    metadata={"title": "Changelog"},
)


@pytest.fixture
def kb(make_kb) -> KnowledgeBase:
    kb = make_kb(reranker="embedding", rerank_candidates=4)
    kb.add_documents([*SMALL_CORPUS, LONG])
    return kb


def windows_of(kb: KnowledgeBase) -> dict[str, np.ndarray]:
    coll = kb.collection("default")
    assert coll is not None
    return coll.vector_set(kb.window_set)


def saved_sets(folder) -> dict[str, dict]:
    """The extra vector sets a saved collection folder holds (``rag.stores.local.format``), by name."""
    return {entry["name"]: entry for entry in json.loads((folder / "extra.json").read_text())}


def test_indexing_a_chunk_embeds_its_windows(kb, embedder, chunker):
    stored = windows_of(kb)
    coll = kb.collection("default")
    assert coll is not None and set(stored) == set(coll.chunks)
    long_chunk = kb.chunks_of("long.md")[0]
    assert len(stored[long_chunk.chunk_id]) > 1  # a long chunk has several windows
    fresh = WindowVectors(embedder, chunker).embed([long_chunk])[0]
    np.testing.assert_allclose(stored[long_chunk.chunk_id], fresh, atol=1e-6)


def test_a_rerank_reads_the_stored_windows_and_ranks_as_embedding_them_would(kb, embedder, chunker):
    before = {k: v.copy() for k, v in windows_of(kb).items()}
    hits = kb.retrieve(QUESTION, top_k=4)
    reranked = kb.rerank(QUESTION, hits, top_k=2)
    standalone = EmbeddingReranker(embedder, chunker, weight=kb.config.rerank_weight)
    assert [h.chunk_id for h in reranked] == [h.chunk_id for h in standalone.rerank(QUESTION, hits, 2)]
    assert reranked[0].doc_id == "paris.html"
    after = windows_of(kb)
    assert after.keys() == before.keys() and all(after[k] is not None for k in before)
    assert all(np.array_equal(after[k], before[k]) for k in before)  # nothing embedded again


def test_windows_follow_their_chunks(kb):
    old = {c.chunk_id for c in kb.chunks_of("long.md")}
    kb.add_documents([LONG.model_copy(update={"text": LONG.text.replace("4417", "9921")})])
    new = {c.chunk_id for c in kb.chunks_of("long.md")}
    stored = windows_of(kb)
    assert new <= set(stored) and not (old - new) & set(stored)
    kb.delete_document("long.md")
    assert not new & set(windows_of(kb))


def test_a_new_title_gives_a_chunk_new_windows(make_kb, embedder, chunker):
    kb = make_kb(reranker="embedding", title_in_embedding=False)  # the title is not in its vector
    kb.add_documents([LONG])
    retitled = LONG.model_copy(update={"metadata": {"title": "Release notes"}})
    kb.add_documents([retitled])  # the same chunk ids (the text is the same), another title
    assert kb.last_ingest.updated == 1 and kb.last_ingest.chunks_embedded == 0  # its vectors kept
    chunk = kb.chunks_of("long.md")[0]
    assert chunk.metadata["title"] == "Release notes"
    fresh = WindowVectors(embedder, chunker).embed([chunk])[0]
    np.testing.assert_allclose(windows_of(kb)[chunk.chunk_id], fresh, atol=1e-6)


def test_windows_are_saved_and_loaded_with_the_index(kb, tmp_path):
    version = kb.save(tmp_path / "index")
    folder = version / "c0000"
    sets = saved_sets(folder)
    assert list(sets) == [kb.window_set] and (folder / sets[kb.window_set]["file"]).is_file()
    loaded = KnowledgeBase.load(tmp_path / "index", embedder=kb.embedder, chunker=kb.chunker)
    saved, back = windows_of(kb), windows_of(loaded)
    assert saved.keys() == back.keys()
    assert all(np.array_equal(saved[k], back[k]) for k in saved)


def test_an_index_saved_without_windows_gets_them_when_first_needed(make_kb, tmp_path, embedder, chunker):
    plain = make_kb()  # reranker off: no windows computed at ingestion
    plain.add_documents(SMALL_CORPUS)
    assert not windows_of(plain)
    plain.save(tmp_path / "index")
    config = plain.config.model_copy(update={"reranker": "embedding", "rerank_candidates": 2})
    kb = KnowledgeBase.load(tmp_path / "index", config, embedder=embedder, chunker=chunker)
    assert not windows_of(kb)
    hits = kb.search(QUESTION, top_k=2)  # the candidates' windows are computed now
    assert hits[0].doc_id == "paris.html" and windows_of(kb)
    lacking = kb.n_chunks - len(windows_of(kb))
    assert 0 < lacking < kb.n_chunks and kb.fill_windows() == lacking and kb.fill_windows() == 0
    coll = kb.collection("default")
    assert coll is not None and set(windows_of(kb)) == set(coll.chunks)
    kb.save()
    again = KnowledgeBase.load(tmp_path / "index", embedder=embedder, chunker=chunker)
    assert set(windows_of(again)) == set(windows_of(kb))


def test_windows_computed_with_other_settings_are_not_read(kb, tmp_path, embedder, chunker):
    version = kb.save(tmp_path / "index")
    meta_path = version / "c0000" / "extra.json"
    meta = json.loads(meta_path.read_text())
    other = window_set_name({**WindowVectors(embedder, chunker).settings, "window_tokens": 48})
    meta[0]["name"] = other
    meta_path.write_text(json.dumps(meta))
    loaded = KnowledgeBase.load(tmp_path / "index", embedder=kb.embedder, chunker=kb.chunker)
    assert not windows_of(loaded)  # computed again when needed, with the reranker's settings
    loaded.search(QUESTION, top_k=2)
    coll = loaded.collection("default")
    assert coll is not None and other not in coll.extra and windows_of(loaded)  # the stale set is gone


def test_window_cache_keeps_a_bounded_number_of_chunks(embedder, chunker, kb):
    cache = WindowCache(WindowVectors(embedder, chunker), capacity=2)
    chunks = [c for info in kb.list_documents() for c in kb.chunks_of(info.id)][:3]
    vectors = cache.window_vectors(chunks)
    assert [len(v) for v in vectors] == [len(windows_of(kb)[c.chunk_id]) for c in chunks]
    assert chunks[0].chunk_id not in cache and chunks[2].chunk_id in cache


def test_a_postgresql_store_keeps_the_windows_its_writers_compute(embedder, chunker, postgres_url):
    config = RAGConfig(document_store=postgres_url, reranker="embedding", rerank_candidates=4)
    writer = KnowledgeBase(config, embedder=embedder, chunker=chunker)
    replica = KnowledgeBase(config, embedder=embedder, chunker=chunker)
    try:
        writer.add_documents([*SMALL_CORPUS, LONG])
        chunk = writer.chunks_of("long.md")[0]
        stored = writer.store.read("default", "long.md")
        assert stored is not None and writer.window_set in stored.chunks[0].extra  # in the database
        late = KnowledgeBase(config, embedder=embedder, chunker=chunker)  # loads them from it
        try:
            np.testing.assert_array_equal(
                windows_of(late)[chunk.chunk_id], windows_of(writer)[chunk.chunk_id]
            )
        finally:
            late.close()
        # a replica follows the writer's change log, window vectors included
        deadline = time.monotonic() + 5
        while chunk.chunk_id not in windows_of(replica) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert chunk.chunk_id in windows_of(replica)
        assert replica.search(QUESTION, top_k=2)[0].doc_id == "paris.html"
    finally:
        replica.close()
        writer.close()


def test_a_postgresql_store_without_windows_fills_them_in_memory(embedder, chunker, postgres_url):
    plain = KnowledgeBase(RAGConfig(document_store=postgres_url), embedder=embedder, chunker=chunker)
    try:
        plain.add_documents(SMALL_CORPUS)  # reranker off: no windows computed at ingestion
    finally:
        plain.close()
    config = RAGConfig(document_store=postgres_url, reranker="embedding", rerank_candidates=2)
    kb = KnowledgeBase(config, embedder=embedder, chunker=chunker)
    try:
        assert not windows_of(kb)
        assert kb.search(QUESTION, top_k=2)[0].doc_id == "paris.html" and windows_of(kb)
        assert kb.fill_windows() > 0 and len(windows_of(kb)) == kb.n_chunks
        stored = kb.store.read("default", "paris.html")
        assert stored is not None and not stored.chunks[0].extra  # held in memory, not written back
    finally:
        kb.close()
