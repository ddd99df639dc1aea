import itertools

import pytest

from rag.ingestion.chunking import Chunker, chunk_id, document_title, token_counter
from rag.ingestion.loaders import load_python_reference
from rag.types import Document


def _paragraphs(n: int, words: int = 30) -> str:
    return "\n\n".join(
        " ".join(f"word{p}x{w}" for w in range(words)) + f". End of paragraph {p}." for p in range(n)
    )


def test_no_chunk_exceeds_max_tokens_on_the_reference(llm_tokenizer):
    count = token_counter(llm_tokenizer)
    small = Chunker(llm_tokenizer, chunk_size=64, overlap=8)
    for doc in load_python_reference()[:25]:
        for c in small.split(doc):
            assert c.n_tokens == count(c.text) <= 64
            assert doc.text[c.start : c.end] == c.text


def test_unbreakable_text_is_cut_by_characters(llm_tokenizer):
    doc = Document(id="blob", text="x" * 3000 + " tail")
    small = Chunker(llm_tokenizer, chunk_size=20, overlap=4)
    chunks = small.split(doc)
    assert all(c.n_tokens <= 20 for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "").startswith("x" * 3000)


def test_paragraph_boundaries_are_preferred(llm_tokenizer):
    text = _paragraphs(6)
    small = Chunker(llm_tokenizer, chunk_size=200, overlap=0)
    paragraph_ends = {
        i + 1 for i in range(len(text)) if text.startswith(".", i) and text[i + 1 : i + 3] in ("\n\n", "")
    }
    chunks = small.split(Document(id="p", text=text))
    assert len(chunks) > 1
    assert all(c.end in paragraph_ends for c in chunks)


def test_sentence_boundaries_when_a_paragraph_is_too_long(llm_tokenizer):
    text = " ".join(f"Sentence number {i} talks about topic {i % 7} at some length." for i in range(80))
    small = Chunker(llm_tokenizer, chunk_size=60, overlap=0)
    chunks = small.split(Document(id="s", text=text))
    assert len(chunks) > 3
    assert all(c.text.endswith(".") for c in chunks)
    assert all(c.text[0].isupper() for c in chunks)


def test_overlap_repeats_the_tail_of_the_previous_chunk(llm_tokenizer):
    text = " ".join(f"Sentence {i} is here." for i in range(200))
    small = Chunker(llm_tokenizer, chunk_size=50, overlap=12)
    chunks = small.split(Document(id="o", text=text))
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.start < nxt.start < prev.end <= nxt.end
        shared = text[nxt.start : prev.end]
        assert 0 < small.count_tokens(shared) <= 12
        assert shared.startswith("Sentence")  # the overlap starts at a sentence


def test_no_overlap_gives_contiguous_chunks(llm_tokenizer):
    text = " ".join(f"Sentence {i} is here." for i in range(100))
    small = Chunker(llm_tokenizer, chunk_size=40, overlap=0)
    chunks = small.split(Document(id="o", text=text))
    for prev, nxt in itertools.pairwise(chunks):
        assert text[prev.end : nxt.start].strip() == ""


def test_ids_are_content_addressed_and_stable(llm_tokenizer):
    doc = Document(id="d", text=_paragraphs(8))
    small = Chunker(llm_tokenizer, chunk_size=100, overlap=10)
    first, again = small.split(doc), small.split(doc)
    assert [c.chunk_id for c in first] == [c.chunk_id for c in again]
    assert len({c.chunk_id for c in first}) == len(first)
    assert first[0].chunk_id == chunk_id("d", first[0].text)
    other = small.split(Document(id="other", text=doc.text))
    assert not {c.chunk_id for c in first} & {c.chunk_id for c in other}


def test_repeated_text_gets_distinct_ids(llm_tokenizer):
    para = "Same boilerplate paragraph repeated."
    doc = Document(id="r", text="\n\n".join([para] * 3))
    chunks = Chunker(llm_tokenizer, chunk_size=8, overlap=0).split(doc)
    assert [c.text for c in chunks] == [para] * 3
    assert len({c.chunk_id for c in chunks}) == 3


def test_whole_short_document_is_one_chunk(chunker):
    doc = Document(id="s", text="  A short note.\n\nWith two paragraphs.  ", metadata={"k": "v"})
    [c] = chunker.split(doc)
    assert (c.text, c.start, c.metadata) == ("A short note.\n\nWith two paragraphs.", 2, {"k": "v"})


def test_blank_document_has_no_chunks(chunker):
    assert chunker.split(Document(id="b", text=" \n ")) == []


def test_any_encode_or_callable_counts():
    words = Chunker(lambda text: text.split(), chunk_size=5, overlap=1)
    chunks = words.split(Document(id="w", text="one two three four five six seven eight nine ten"))
    assert all(len(c.text.split()) <= 5 for c in chunks) and len(chunks) >= 2

    class Encoder:
        def encode(self, text):
            return list(text)

    assert token_counter(Encoder())("abc") == 3


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_sizes_are_rejected(size, overlap):
    with pytest.raises(ValueError, match=r"chunk_size|overlap"):
        Chunker(lambda t: t.split(), chunk_size=size, overlap=overlap)


def test_tokenizer_by_model_name_loads_lazily():
    chunker = Chunker("smollm2-135m-instruct", chunk_size=16, overlap=0)
    assert chunker._count is None
    assert chunker.count_tokens("hello world") == 2
    assert chunker.resized(8, 2).count_tokens("hello world") == 2  # shares the loaded tokenizer


def test_bad_tokenizer_is_rejected():
    with pytest.raises(ValueError, match="tokenizer"):
        token_counter(42)


@pytest.mark.parametrize(
    ("text", "metadata", "title"),
    [
        ("# Heading\nbody", {}, "Heading"),
        ('The "if" statement\n******************\n\nbody', {}, 'The "if" statement'),
        ("Short title\n\nbody", {}, "Short title"),
        ("A sentence that just\ncontinues on the next line.", {}, None),
        ("body", {"title": "From  metadata"}, "From metadata"),
    ],
)
def test_document_title(text, metadata, title):
    assert document_title(Document(id="x", text=text, metadata=metadata)) == title
