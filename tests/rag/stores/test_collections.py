"""Collections in the knowledge base: separate stores and indexes, searches that read only the
collections named, ids unique per collection, and the saved format (including format 1 indexes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag.config import RAGConfig
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.diversity import DiverseRetriever
from rag.retrieval.federated import FederatedBM25, FederatedIndex
from rag.retrieval.retriever import DenseRetriever, HybridRetriever
from rag.stores.local.format import FORMAT_VERSION, read_config
from rag.stores.local.versions import current_version, save_version
from rag.types import DEFAULT_COLLECTION, Document
from tests.rag.corpus import SMALL_CORPUS

QUESTIONS = {  # question -> the one right document of SMALL_CORPUS
    "What do cats do when they are content?": "cats.md",
    "How do I remove the last item of a Python list?": "python-lists.txt",
    "When was the Eiffel Tower completed?": "paris.html",
    "How does a prefix KV cache cut the time to first token?": "kv-cache.md",
}
# Another tenant's documents on the same topics (same ids, one identical copy): everything that could
# pull a search of collection "a" off course if collections leaked into each other.
DISTRACTORS = [
    Document(id="cats.md", text="# Cats\n\nBob's cats purr when content; they are called Zed and Yan."),
    Document(id="lists.md", text="Python lists: pop() removes the last item; Bob prefers deque.popleft()."),
    Document(id="eiffel.md", text="The Eiffel Tower was completed in 1889; Bob climbed it in 2004."),
    Document(id="prefill.md", text="A prefix KV cache reuses keys and values and cuts time to first token."),
    SMALL_CORPUS[3],
]


def _hits(kb: KnowledgeBase, question: str, mode: str, k: int, collections: list[str] | None = None):
    return [
        (h.doc_id, h.chunk_id, h.score, h.collection)
        for h in kb.search(question, k, mode, collections=collections)
    ]  # type: ignore[arg-type]


def _recall(ranked: dict[str, list[tuple]], k: int) -> float:
    """Share of QUESTIONS whose right document is among the first ``k`` hits."""
    return sum(QUESTIONS[q] in {h[0] for h in hits[:k]} for q, hits in ranked.items()) / len(ranked)


@pytest.fixture(scope="module")
def two_tenants(embedder, llm_tokenizer) -> KnowledgeBase:
    from rag.ingestion.chunking import Chunker

    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer))
    kb.add_documents(SMALL_CORPUS, collection="a")
    kb.add_documents(DISTRACTORS, collection="b")
    return kb


@pytest.fixture(scope="module")
def alone(embedder, llm_tokenizer) -> KnowledgeBase:
    """Collection "a"'s documents indexed on their own."""
    from rag.ingestion.chunking import Chunker

    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer))
    kb.add_documents(SMALL_CORPUS, collection="a")
    return kb


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_a_collection_searches_exactly_as_its_documents_indexed_alone(two_tenants, alone, mode):
    """Same hits, same scores, same order (so the same recall at every k): a search's top k is a
    prefix of its top 4 (flat FAISS is exact; hybrid pools a fixed depth)."""
    shared = {q: _hits(two_tenants, q, mode, 4, ["a"]) for q in QUESTIONS}
    own = {q: _hits(alone, q, mode, 4) for q in QUESTIONS}
    assert shared == own
    assert [_recall(shared, k) for k in (1, 2, 4)] == [_recall(own, k) for k in (1, 2, 4)]
    assert _recall(shared, 2) == 1.0


def test_a_search_reads_only_the_indexes_of_the_collections_named(two_tenants):
    a, b = two_tenants.collection("a"), two_tenants.collection("b")
    assert a is not None and b is not None
    one = _undiversified(two_tenants.retriever("hybrid", collections=["a"]))
    assert isinstance(one, HybridRetriever)
    assert one.dense.index is a.index and one.lexical.bm25 is a.bm25 and one.dense.chunks is a.chunks
    both = _undiversified(two_tenants.retriever("dense", collections=["a", "b"]))
    assert isinstance(both, DenseRetriever) and isinstance(both.index, FederatedIndex)
    assert both.index.indexes == [a.index, b.index]
    lexical = _undiversified(two_tenants.retriever("hybrid", collections=["b", "missing"])).lexical  # type: ignore[attr-defined]
    assert isinstance(lexical.bm25, FederatedBM25) is False and lexical.bm25 is b.bm25
    for mode in ("dense", "bm25", "hybrid"):
        hits = two_tenants.search("Bob cats Zed Yan deque climbed", 10, mode, collections=["a"])  # type: ignore[arg-type]
        assert hits and {h.collection for h in hits} == {"a"}
        assert not {h.chunk_id for h in hits} & set(b.chunks)
    assert two_tenants.search("cats", 3, collections=[]) == []
    assert two_tenants.search("cats", 3, collections=["nobody-here"]) == []


def _undiversified(retriever: Any) -> Any:
    """The first-stage retriever under the per-document diversity wrapper."""
    return retriever.inner if isinstance(retriever, DiverseRetriever) else retriever


def test_dense_search_over_several_collections_is_exact(two_tenants, embedder, llm_tokenizer):
    """Merging each collection's top k by cosine gives the top k of one index over all of them."""
    from rag.ingestion.chunking import Chunker

    union = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer))
    union.add_documents(SMALL_CORPUS, collection="a")
    union.add_documents([Document(id=f"b/{d.id}", text=d.text) for d in DISTRACTORS], collection="a")
    for question in [*QUESTIONS, "Who climbed the tower?"]:
        federated = [(h.text, round(h.score, 5)) for h in two_tenants.search(question, 5, "dense")]
        single = [(h.text, round(h.score, 5)) for h in union.search(question, 5, "dense")]
        assert federated == single


def test_ids_are_unique_per_collection(make_kb):
    kb = make_kb()
    mine, theirs = (
        Document(id="notes.md", text="Alice's plan: ship on Friday."),
        Document(id="notes.md", text="Bob's plan: ship on Monday."),
    )
    kb.add_documents([mine], collection="alice")
    kb.add_documents([theirs], collection="bob")
    kb.add_documents([mine], collection="shared")  # the very same text in a third collection
    assert kb.get_document("notes.md", "alice") == mine and kb.get_document("notes.md", "bob") == theirs
    assert kb.get_document("notes.md") is None  # the default collection holds no such id
    ids = {c: {ch.chunk_id for ch in kb.chunks_of("notes.md", c)} for c in ("alice", "bob", "shared")}
    assert not ids["alice"] & ids["shared"]  # same text, different collection: different chunk ids
    assert kb.delete_document("notes.md", "bob") and kb.get_document("notes.md", "bob") is None
    assert kb.get_document("notes.md", "alice") == mine and kb.get_document("notes.md", "shared") == mine
    assert [(i.id, i.collection) for i in kb.list_documents(["shared", "alice"])] == [
        ("notes.md", "shared"),
        ("notes.md", "alice"),
    ]
    assert kb.count(["alice"]) == 1 and kb.count() == 2 and kb.collections() == ["alice", "shared"]


def test_bad_collection_names_are_refused(make_kb):
    kb = make_kb()
    doc = Document(id="x", text="text")
    for bad in ("", "../etc", ".hidden", "a/b", "x" * 65, "white space"):
        with pytest.raises(ValueError, match="collection"):
            kb.add_documents([doc], collection=bad)
        with pytest.raises(ValueError, match="collection"):
            kb.search("text", 1, collections=[bad])
    with pytest.raises(ValueError, match="list of names"):
        kb.search("text", 1, collections="alice")  # a string would be read letter by letter
    assert len(kb) == 0


def test_collections_survive_save_and_load_and_unchanged_ones_are_linked(two_tenants, embedder, tmp_path):
    first = two_tenants.save(tmp_path)
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["format"] == FORMAT_VERSION
    assert [(c["name"], c["n_documents"]) for c in manifest["collections"]] == [("a", 4), ("b", 5)]
    loaded = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert loaded.list_documents() == two_tenants.list_documents()
    for question in list(QUESTIONS)[:2]:
        for names in (["a"], ["b"], None):
            assert loaded.search(question, 3, collections=names) == two_tenants.search(
                question, 3, collections=names
            )
    inodes = {p.name: p.stat().st_ino for p in (first / "c0000").iterdir()}
    loaded.add_documents([Document(id="new.md", text="A new note for b.")], collection="b")
    second = loaded.save(tmp_path)
    assert {p.name: p.stat().st_ino for p in (second / "c0000").iterdir()} == inodes  # "a": linked
    assert loaded.get_document("new.md", "b") is not None
    assert KnowledgeBase.load(tmp_path, embedder=embedder).count(["b"]) == 6


def _write_format_1(directory: Path, kb: KnowledgeBase) -> None:
    """A version directory exactly as format 1 (before collections) wrote it: one collection's files at
    the top level, chunks without a collection field."""
    coll = kb.collection(DEFAULT_COLLECTION)
    assert coll is not None
    docs = [
        {"doc": r.doc.model_dump(mode="json"), "digest": r.digest, "chunk_ids": r.chunk_ids}
        for r in coll.docs.values()
    ]
    chunks = [c.model_dump(mode="json", exclude={"collection"}) for c in coll.chunks.values()]
    (directory / "documents.json").write_text(json.dumps(docs), encoding="utf-8")
    (directory / "chunks.json").write_text(json.dumps(chunks), encoding="utf-8")
    coll.index.write(directory)
    manifest = {
        "format": 1,
        "config": kb.config.model_dump(mode="json", exclude={"index_dir"}),
        "embedder_dim": coll.index.dim,
        "n_documents": len(coll),
        "n_chunks": coll.n_chunks,
    }
    (directory / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def test_an_index_saved_before_collections_loads_as_the_default_collection(make_kb, embedder, tmp_path):
    old = make_kb()
    old.add_documents(SMALL_CORPUS)
    save_version(tmp_path, lambda d: _write_format_1(d, old))
    assert read_config(current_version(tmp_path)).chunk_size == old.config.chunk_size
    kb = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert kb.collections() == [DEFAULT_COLLECTION]
    assert [d.id for d in kb.list_documents()] == [d.id for d in SMALL_CORPUS]
    assert all(kb.get_document(d.id) == d for d in SMALL_CORPUS)
    for mode in ("dense", "bm25", "hybrid"):
        question = next(iter(QUESTIONS))
        assert kb.search(question, 2, mode) == old.search(question, 2, mode)  # type: ignore[arg-type]
    kb.add_documents(SMALL_CORPUS)
    assert kb.last_ingest.unchanged == 4  # digests and chunk ids carried over: nothing re-embedded
    kb.add_documents([Document(id="extra.md", text="An extra note.")], collection="team")
    version = kb.save(tmp_path)  # written in the current format from now on
    assert json.loads((version / "manifest.json").read_text())["format"] == FORMAT_VERSION
    again = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert again.collections() == [DEFAULT_COLLECTION, "team"] and len(again) == 5


def test_an_unknown_format_is_refused(make_kb, tmp_path):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS[:1])
    version = kb.save(tmp_path)
    manifest = json.loads((version / "manifest.json").read_text())
    (version / "manifest.json").write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(ValueError, match="unsupported index format 99"):
        KnowledgeBase.load(tmp_path, RAGConfig())
