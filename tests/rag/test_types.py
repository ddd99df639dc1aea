import pytest

from rag.types import Chunk, Document, ScoredChunk


def test_document_defaults_and_frozen():
    doc = Document(id="a", text="hello")
    assert doc.metadata == {}
    with pytest.raises(ValueError):
        doc.id = "b"  # type: ignore[misc]


@pytest.mark.parametrize("bad_id", ["", "   "])
def test_blank_id_is_rejected(bad_id):
    with pytest.raises(ValueError, match="non-empty"):
        Document(id=bad_id, text="x")


def test_text_must_be_a_string():
    with pytest.raises(ValueError):
        Document(id="a", text=None)  # type: ignore[arg-type]


def test_chunk_span_is_checked():
    with pytest.raises(ValueError, match="before start"):
        Chunk(doc_id="a", chunk_id="c", text="x", start=5, end=2, n_tokens=1)


def test_scored_chunk_of_chunk():
    chunk = Chunk(doc_id="a", chunk_id="c1", text="hi", start=0, end=2, n_tokens=1, metadata={"k": 1})
    hit = ScoredChunk.of(chunk, 0.5)
    assert (hit.doc_id, hit.chunk_id, hit.score, hit.text, hit.metadata) == ("a", "c1", 0.5, "hi", {"k": 1})
