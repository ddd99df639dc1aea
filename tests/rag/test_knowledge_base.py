import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rag.config import RAGConfig
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.index import VectorIndex
from rag.stores.local.versions import current_version
from rag.types import Document
from tests.rag.corpus import SMALL_CORPUS

REPO = Path(__file__).resolve().parents[2]


def ids(hits):
    return [h.doc_id for h in hits]


def test_add_returns_ids_and_indexes_every_chunk(make_kb):
    kb = make_kb()
    assert kb.add_documents(SMALL_CORPUS) == [d.id for d in SMALL_CORPUS]
    assert len(kb) == 4 and kb.n_chunks == 4
    assert kb.last_ingest.added == 4 and kb.last_ingest.chunks_embedded == 4
    assert kb.get_document("cats.md") == SMALL_CORPUS[0]
    assert kb.get_document("nope") is None
    info = {i.id: i for i in kb.list_documents()}
    assert info["cats.md"].n_chunks == 1 and info["cats.md"].metadata == {"source": "cats.md"}


def test_reingesting_unchanged_documents_is_a_noop(make_kb):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS)
    chunks_before = {c.chunk_id for d in SMALL_CORPUS for c in kb.chunks_of(d.id)}
    kb.add_documents(SMALL_CORPUS)
    assert kb.last_ingest.unchanged == 4 and kb.last_ingest.chunks_embedded == 0
    assert {c.chunk_id for d in SMALL_CORPUS for c in kb.chunks_of(d.id)} == chunks_before
    assert len(kb.collection("default").index) == 4 and len(kb.collection("default").bm25) == 4


def test_changed_document_replaces_its_chunks(make_kb):
    kb = make_kb(chunk_size=24, chunk_overlap=0)
    parts = [f"Paragraph {i} is about topic number {i} and nothing else." for i in range(4)]
    kb.add_documents([Document(id="d", text="\n\n".join(parts))])
    before = {c.chunk_id: c.text for c in kb.chunks_of("d")}
    parts[2] = "Paragraph two now explains quantum chromodynamics instead."
    kb.add_documents([Document(id="d", text="\n\n".join(parts))])
    after = {c.chunk_id: c.text for c in kb.chunks_of("d")}
    assert kb.last_ingest.updated == 1
    assert kb.last_ingest.chunks_embedded == len(set(after) - set(before)) >= 1  # unchanged chunks kept
    assert kb.last_ingest.chunks_removed == len(set(before) - set(after)) >= 1
    gone = set(before) - set(after)
    assert not gone & set(kb.collection("default").index.keys()) and not any(
        g in kb.collection("default").bm25 for g in gone
    )
    hits = kb.search("quantum chromodynamics", top_k=1, mode="bm25")
    assert hits[0].text == parts[2]
    assert kb.search("topic number 2", top_k=kb.n_chunks, mode="bm25")[0].chunk_id not in gone


def test_metadata_change_updates_chunks_without_reembedding(make_kb):
    kb = make_kb()
    kb.add_documents([Document(id="a", text="Some text about caches.", metadata={"v": 1})])
    kb.add_documents([Document(id="a", text="Some text about caches.", metadata={"v": 2})])
    assert kb.last_ingest.updated == 1 and kb.last_ingest.chunks_embedded == 0
    assert kb.search("caches", top_k=1)[0].metadata["v"] == 2


def test_delete_removes_from_dense_and_bm25(make_kb):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS)
    chunk_ids = {c.chunk_id for c in kb.chunks_of("paris.html")}
    assert kb.delete_document("paris.html") is True
    assert kb.delete_document("paris.html") is False
    assert "paris.html" not in kb and kb.n_chunks == 3
    for mode in ("dense", "bm25", "hybrid"):
        assert "paris.html" not in ids(kb.search("Eiffel Tower in Paris", top_k=4, mode=mode))
    assert not chunk_ids & set(kb.collection("default").index.keys())
    assert not any(c in kb.collection("default").bm25 for c in chunk_ids)


def test_save_load_round_trip(make_kb, embedder, tmp_path):
    kb = make_kb(retrieval_mode="hybrid")
    kb.add_documents(SMALL_CORPUS)
    version = kb.save(tmp_path / "index")
    assert {p.name for p in version.iterdir()} == {"manifest.json", "c0000"}
    assert {p.name for p in (version / "c0000").iterdir()} == {
        "documents.json", "chunks.json", "vectors.npy", "keys.json", "index.json",
    }  # fmt: skip
    loaded = KnowledgeBase.load(tmp_path / "index", embedder=embedder)
    assert [d.id for d in loaded.list_documents()] == [d.id for d in SMALL_CORPUS]
    assert loaded.get_document("kv-cache.md") == SMALL_CORPUS[3]
    for mode in ("dense", "bm25", "hybrid"):
        query = "how does reusing the prefix cut time to first token?"
        assert loaded.search(query, 3, mode=mode) == kb.search(query, 3, mode=mode)
    loaded.add_documents(SMALL_CORPUS)
    assert loaded.last_ingest.unchanged == 4  # digests survive the round trip


def test_the_engine_config_is_not_part_of_a_saved_index(make_kb, embedder, tmp_path):
    """An index does not depend on the engine that answers from it: none is saved, and an "engine"
    entry in an older manifest (with fields this version does not know) is ignored."""
    import json

    kb = make_kb()
    kb.add_documents(SMALL_CORPUS[:1])
    manifest_path = kb.save(tmp_path) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert "engine" not in manifest["config"]
    manifest["config"]["engine"] = {"cache_bytes": 1, "a_field_from_another_version": True}
    manifest_path.write_text(json.dumps(manifest))
    loaded = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert loaded.config.engine == RAGConfig().engine
    assert [d.id for d in loaded.list_documents()] == [SMALL_CORPUS[0].id]


def test_load_rejects_a_different_ingest_config(make_kb, tmp_path):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS[:1])
    kb.save(tmp_path)
    assert KnowledgeBase.load(tmp_path, RAGConfig(top_k=2, retrieval_mode="dense")).config.top_k == 2
    with pytest.raises(ValueError, match="chunk_size=256"):
        KnowledgeBase.load(tmp_path, RAGConfig(chunk_size=128))
    with pytest.raises(FileNotFoundError, match="no saved index"):
        KnowledgeBase.load(tmp_path / "missing")


def test_crash_mid_save_leaves_previous_index_loadable(make_kb, embedder, tmp_path, monkeypatch):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS[:2])
    good = kb.save(tmp_path)
    kb.add_documents(SMALL_CORPUS[2:])

    def crash(self, directory):
        (directory / "vectors.npy").write_bytes(b"partial")
        raise OSError("simulated crash while writing vectors")

    monkeypatch.setattr(VectorIndex, "write", crash)
    with pytest.raises(OSError, match="simulated crash"):
        kb.save(tmp_path)
    monkeypatch.undo()
    assert current_version(tmp_path) == good
    loaded = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert [d.id for d in loaded.list_documents()] == ["cats.md", "python-lists.txt"]
    assert loaded.search("what do cats do when content?", top_k=1)[0].doc_id == "cats.md"


def test_process_killed_mid_save_leaves_previous_index_loadable(make_kb, embedder, tmp_path):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS)
    good = kb.save(tmp_path)
    script = textwrap.dedent(
        f"""
        import os, signal
        from rag.retrieval.index import VectorIndex
        from rag.knowledge_base import KnowledgeBase

        kb = KnowledgeBase.load({str(tmp_path)!r})
        real_write = VectorIndex.write

        def write_then_die(self, directory):
            real_write(self, directory)
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup handlers run

        VectorIndex.write = write_then_die
        kb.delete_document("cats.md")  # saved before it returns: the process dies mid-save
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # the half-written version
    assert current_version(tmp_path) == good
    loaded = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert "cats.md" in loaded and loaded.n_chunks == 4
    loaded.save(tmp_path)  # the next save cleans up what the killed one left
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_config_records_the_components_given(embedder, llm_tokenizer):
    from rag.ingestion.chunking import Chunker

    kb = KnowledgeBase(RAGConfig(chunk_size=64), embedder=embedder, chunker=Chunker(llm_tokenizer, 100, 10))
    assert (kb.config.embedder, kb.config.chunk_size, kb.config.chunk_overlap) == (
        embedder.model_name,
        100,
        10,
    )


def test_save_needs_a_directory(make_kb, tmp_path):
    kb = make_kb()
    with pytest.raises(ValueError, match="directory"):
        kb.save()
    kb.config = RAGConfig(index_dir=tmp_path / "cfg")
    assert kb.save().parent == tmp_path / "cfg"


def test_bad_documents_are_rejected(make_kb):
    kb = make_kb()
    with pytest.raises(ValueError, match="'empty' is empty"):
        kb.add_documents([Document(id="empty", text="   ")])
    with pytest.raises(ValueError, match="'a' appears twice"):
        kb.add_documents([Document(id="a", text="x"), Document(id="a", text="y")])
    with pytest.raises(ValueError, match="expected Document"):
        kb.add_documents(["just a string"])  # type: ignore[list-item]
    assert len(kb) == 0


def test_ingest_paths_reports_skipped(make_kb, tmp_path):
    (tmp_path / "a.md").write_text("# Alpha\n\nAlpha text.", encoding="utf-8")
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02")
    kb = make_kb()
    result = kb.ingest(tmp_path)
    assert [d.id for d in result.documents] == ["a.md"] and "a.md" in kb
    assert [Path(s.path).name for s in result.skipped] == ["b.bin"]
    with pytest.raises(FileNotFoundError):
        kb.ingest(tmp_path / "missing")
