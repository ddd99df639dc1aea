"""Window vectors for the embedding reranker: computed when a chunk is indexed, kept in step with it,
saved with the index, and computed on first use for an index saved without them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag.ingestion.index_format import WINDOWS_JSON, WINDOWS_NPY
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.rerank import EmbeddingReranker
from rag.retrieval.windows import WindowCache, WindowVectors
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
    return coll.windows


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


def test_windows_are_saved_and_loaded_with_the_index(kb, tmp_path):
    version = kb.save(tmp_path / "index")
    folder = version / "c0000"
    assert (folder / WINDOWS_NPY).is_file() and (folder / WINDOWS_JSON).is_file()
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


def test_windows_computed_with_other_settings_are_not_read(kb, tmp_path):
    version = kb.save(tmp_path / "index")
    meta_path = version / "c0000" / WINDOWS_JSON
    meta = json.loads(meta_path.read_text())
    meta["settings"]["window_tokens"] = 48
    meta_path.write_text(json.dumps(meta))
    loaded = KnowledgeBase.load(tmp_path / "index", embedder=kb.embedder, chunker=kb.chunker)
    assert not windows_of(loaded)  # computed again when needed, with the reranker's settings


def test_window_cache_keeps_a_bounded_number_of_chunks(embedder, chunker, kb):
    cache = WindowCache(WindowVectors(embedder, chunker), capacity=2)
    chunks = [c for info in kb.list_documents() for c in kb.chunks_of(info.id)][:3]
    vectors = cache.window_vectors(chunks)
    assert [len(v) for v in vectors] == [len(windows_of(kb)[c.chunk_id]) for c in chunks]
    assert chunks[0].chunk_id not in cache and chunks[2].chunk_id in cache
