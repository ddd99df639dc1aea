import pytest

from rag.retrieval.diversity import DiverseRetriever, cap_per_document
from rag.types import Document, ScoredChunk

LOOPS = " ".join(
    f"Loop fact {i}: a for loop repeats its body once for every item of an iterable, and a while loop "
    f"repeats it while its condition stays true."
    for i in range(12)
)
CORPUS = [
    Document(id="loops.md", text=f"# Loops\n\n{LOOPS}"),
    Document(id="break.md", text="# Break\n\nThe break statement leaves the innermost loop at once."),
    Document(id="cats.md", text="# Cats\n\nCats purr when content and sleep most of the day."),
]


def hits(*docs: str) -> list[ScoredChunk]:
    return [
        ScoredChunk(doc_id=d, chunk_id=f"{d}{i}", score=1.0 - i / 10, text="") for i, d in enumerate(docs)
    ]


def test_cap_keeps_each_documents_best_first_then_fills_from_the_skipped():
    picked = cap_per_document(hits("a", "a", "b", "a", "c"), per_document=1, top_k=4)
    assert [h.chunk_id for h in picked] == ["a0", "b2", "c4", "a1"]
    picked = cap_per_document(hits("a", "a", "b", "a"), per_document=2, top_k=3)
    assert [h.chunk_id for h in picked] == ["a0", "a1", "b2"]
    assert cap_per_document(hits("a", "a"), per_document=1, top_k=5) == hits("a", "a")
    with pytest.raises(ValueError, match="per_document"):
        cap_per_document(hits("a"), per_document=0, top_k=1)


@pytest.fixture(scope="module")
def loops_kb(embedder, llm_tokenizer):
    from rag.config import RAGConfig
    from rag.ingestion.chunking import Chunker
    from rag.knowledge_base import KnowledgeBase

    kb = KnowledgeBase(
        RAGConfig(chunk_size=64, chunk_overlap=8), embedder=embedder, chunker=Chunker(llm_tokenizer, 64, 8)
    )
    kb.add_documents(CORPUS)
    assert len(kb.chunks_of("loops.md")) >= 4
    return kb


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_a_long_document_does_not_fill_the_top_k(loops_kb, mode):
    query = "how does a loop repeat its body?"
    free = loops_kb.retriever(mode).inner.retrieve(query, 50)
    assert [h.doc_id for h in free[:2]] == ["loops.md", "loops.md"]  # undiversified: one document first
    capped = loops_kb.search(query, top_k=3, mode=mode)
    assert capped[0] == free[0] and len(capped) == 3
    assert len({h.doc_id for h in capped}) == min(3, len({h.doc_id for h in free}))


def test_a_single_document_still_gets_top_k_chunks(embedder, llm_tokenizer):
    from rag.config import RAGConfig
    from rag.ingestion.chunking import Chunker
    from rag.knowledge_base import KnowledgeBase

    kb = KnowledgeBase(
        RAGConfig(chunk_size=64, chunk_overlap=8), embedder=embedder, chunker=Chunker(llm_tokenizer, 64, 8)
    )
    kb.add_documents(CORPUS[:1])
    got = kb.search("how does a loop repeat its body?", top_k=3)
    assert len(got) == 3 and {h.doc_id for h in got} == {"loops.md"}


def test_cap_of_two(loops_kb):
    inner = loops_kb.retriever("dense").inner
    two = DiverseRetriever(inner, per_document=2).retrieve("how does a loop repeat its body?", 4)
    assert [h.doc_id for h in two].count("loops.md") == 2
    with pytest.raises(ValueError, match="per_document"):
        DiverseRetriever(inner, per_document=0)
