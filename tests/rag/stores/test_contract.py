"""The DocumentStore contract, run against every backend (the local index directory and a real
PostgreSQL): whole-document writes visible at once, replaced and deleted whole, kept apart per
collection, durable across reopening (extra vector sets too), listed in an ordered change log,
refused whole when invalid, and tied to the ingest-time config they were made with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.retrieval.index import VectorIndex
from rag.stores import ChunkRecord, DocumentStore, DocumentWrite, LocalStore
from rag.stores.indexes import SearchIndexes
from rag.types import Chunk, Document

DIM = 8
BACKENDS = ["local", "postgresql"]


def _indexes() -> SearchIndexes:
    return SearchIndexes(lambda dim: VectorIndex(dim, kind="flat"), lambda: DIM, lambda c: c.text)


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((1, DIM)).astype(np.float32)
    return v / np.linalg.norm(v)


def write(
    collection: str, doc_id: str, texts: list[str], *, seed: int = 0, extra: bool = False
) -> DocumentWrite:
    """A document of one chunk per text, each with a vector made from (seed, position)."""
    doc = Document(id=doc_id, text=" ".join(texts), metadata={"source": doc_id})
    chunks = []
    start = 0
    for i, text in enumerate(texts):
        chunk = Chunk(
            doc_id=doc_id, chunk_id=f"{collection}:{doc_id}:{text}", text=text, start=start,
            end=start + len(text), n_tokens=len(text.split()), metadata=dict(doc.metadata), collection=collection,
        )  # fmt: skip
        start += len(text) + 1
        sets = {"windows": np.repeat(_vector(seed + i + 100), 2, axis=0)} if extra else {}
        chunks.append(ChunkRecord(chunk, _vector(seed + i), sets))
    return DocumentWrite(collection, doc, f"digest-{seed}-{'|'.join(texts)}", tuple(chunks))


@pytest.fixture(params=BACKENDS)
def opener(request, tmp_path: Path) -> Iterator[Callable[[], tuple[DocumentStore, SearchIndexes]]]:
    """Opens a store (and indexes attached to it) on one location: a directory, or a database."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    opened: list[DocumentStore] = []

    def open_store() -> tuple[DocumentStore, SearchIndexes]:
        for earlier in opened:  # a local directory has one writer: the earlier one lets go
            earlier.close()
        if url is not None:
            from rag.stores.postgres import PostgresStore

            store: DocumentStore = PostgresStore(url, poll_s=0.1)
        else:
            store = LocalStore(tmp_path / "index")
        store.check_config(RAGConfig())
        indexes = _indexes()
        store.attach(indexes)
        opened.append(store)
        return store, indexes

    yield open_store
    for store in opened:
        store.close()


def _hits(indexes: SearchIndexes, collection: str, query: np.ndarray) -> list[str]:
    coll = indexes.get(collection)
    return [key for key, _ in coll.index.search(query[0], 3)] if coll is not None else []


def _same(a: DocumentWrite | None, b: DocumentWrite | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        (a.collection, a.document, a.digest) == (b.collection, b.document, b.digest)
        and [r.chunk for r in a.chunks] == [r.chunk for r in b.chunks]
        and all(np.array_equal(x.vectors, y.vectors) for x, y in zip(a.chunks, b.chunks, strict=True))
        and all(
            x.extra.keys() == y.extra.keys() and all(np.array_equal(x.extra[k], y.extra[k]) for k in x.extra)
            for x, y in zip(a.chunks, b.chunks, strict=True)
        )
    )


def test_a_write_is_stored_whole_and_searchable_at_once(opener):
    store, indexes = opener()
    doc = write("alice", "notes.md", ["ferry at seven", "bakery at eight", "harbour closes late"], seed=1)
    position = store.write([doc])
    assert position >= 1
    assert _same(store.read("alice", "notes.md"), doc)
    assert _same(indexes.record("alice", "notes.md"), doc)
    assert _hits(indexes, "alice", doc.chunks[1].vectors)[0] == doc.chunks[1].chunk_id
    assert indexes.get("alice").bm25.search("bakery", 1)[0][0] == doc.chunks[1].chunk_id
    [info] = store.list_documents()
    assert (info.id, info.collection, info.n_chunks, info.metadata) == (
        "notes.md",
        "alice",
        3,
        {"source": "notes.md"},
    )


def test_a_rewrite_replaces_the_chunks_and_a_delete_removes_everything(opener):
    store, indexes = opener()
    first = write("alice", "notes.md", ["ferry at seven", "bakery at eight", "harbour closes late"], seed=1)
    store.write([first])
    second = write("alice", "notes.md", ["ferry at seven", "market on friday"], seed=1)
    store.write([second])
    assert _same(store.read("alice", "notes.md"), second)
    coll = indexes.get("alice")
    assert set(coll.chunks) == {r.chunk_id for r in second.chunks}
    assert set(coll.index.keys()) == set(coll.chunks) and len(coll.bm25) == 2
    assert store.delete("alice", "notes.md") is True
    assert store.read("alice", "notes.md") is None and indexes.record("alice", "notes.md") is None
    assert not coll.chunks and not len(coll.index) and not len(coll.bm25)
    assert store.delete("alice", "notes.md") is False
    assert store.list_documents() == []


def test_collections_keep_the_same_id_apart(opener):
    store, indexes = opener()
    mine, theirs = (
        write("alice", "plan.md", ["ship on friday"], seed=1),
        write("bob", "plan.md", ["ship on monday"], seed=2),
    )
    store.write([mine, theirs])
    assert [(i.collection, i.id) for i in store.list_documents(["bob", "alice"])] == [
        ("bob", "plan.md"),
        ("alice", "plan.md"),
    ]
    assert store.delete("bob", "plan.md")
    assert _same(store.read("alice", "plan.md"), mine) and store.read("bob", "plan.md") is None
    assert indexes.names() == ["alice"]


def test_everything_survives_reopening(opener):
    store, _ = opener()
    docs = [
        write("alice", "a.md", ["one two", "three four"], seed=1, extra=True),
        write("alice", "b.md", ["five six"], seed=3),
        write("shared", "h.md", ["seven eight", "nine ten"], seed=5, extra=True),
    ]
    store.write(docs[:2])
    store.write(docs[2:])
    store.write([write("alice", "gone.md", ["eleven"], seed=7)])
    store.delete("alice", "gone.md")
    listed = store.list_documents()
    again, reloaded = opener()
    assert again.list_documents() == listed
    assert [(i.collection, i.id) for i in listed] == [
        ("alice", "a.md"),
        ("alice", "b.md"),
        ("shared", "h.md"),
    ]
    for doc in docs:
        assert _same(again.read(*doc.key), doc) and _same(reloaded.record(*doc.key), doc)
        for record in doc.chunks:
            assert _hits(reloaded, doc.collection, record.vectors)[0] == record.chunk_id
    assert reloaded.names() == ["alice", "shared"]


def test_the_change_log_holds_every_change_in_order_with_its_state_now(opener):
    store, _ = opener()
    start = store.changes_since(0).position
    p1 = store.write([write("alice", "a.md", ["one"], seed=1)])
    p2 = store.write([write("alice", "b.md", ["two"], seed=2)])
    p3 = store.write([write("alice", "a.md", ["one again"], seed=3)])
    assert start < p1 < p2 < p3
    store.delete("alice", "b.md")
    batch = store.changes_since(start)
    assert [(c.doc_id, c.state is None) for c in batch.changes] == [("a.md", False), ("b.md", True)]
    assert _same(batch.changes[0].state, write("alice", "a.md", ["one again"], seed=3))
    assert [c.position for c in batch.changes] == sorted(c.position for c in batch.changes)
    assert store.changes_since(batch.position).changes == []


def test_a_document_stored_with_the_same_digest_is_left_as_it_is(opener):
    store, _ = opener()
    first = store.write([write("alice", "a.md", ["one"], seed=1)])
    assert store.write([write("alice", "a.md", ["one"], seed=1)]) == first  # shown at its position
    assert [c.doc_id for c in store.changes_since(0).changes] == ["a.md"]
    assert store.changes_since(first).changes == []  # nothing logged


def test_an_invalid_write_is_refused_whole(opener):
    store, indexes = opener()
    good = write("alice", "good.md", ["fine text"], seed=1)
    bad = write("alice", "bad.md", ["broken vectors"], seed=2)
    bad = DocumentWrite(
        bad.collection,
        bad.document,
        bad.digest,
        (ChunkRecord(bad.chunks[0].chunk, np.zeros((1, DIM + 1), np.float32)),),
    )
    store.write([write("alice", "first.md", ["sets the dim"], seed=3)])
    with pytest.raises(ValueError, match=r"bad\.md"):
        store.write([good, bad])
    assert store.read("alice", "good.md") is None and indexes.record("alice", "good.md") is None
    assert [i.id for i in store.list_documents()] == ["first.md"]


def test_a_store_keeps_the_ingest_settings_it_was_built_with(opener):
    store, _ = opener()
    store.write([write("alice", "a.md", ["one"], seed=1)])
    again, _ = opener()
    assert again.check_config(RAGConfig(top_k=7)).chunk_size == RAGConfig().chunk_size
    with pytest.raises(ValueError, match="chunk_size=256"):
        again.check_config(RAGConfig(chunk_size=128))
