"""One check per question: ``Query.of`` at the entry point, nothing checked again inside; the
retrievers a knowledge base searches with are built once per (mode, collections) and rebuilt only
when the set of collections changes; the messages a caller sees name the bad value."""

from __future__ import annotations

import pytest

from engine import Engine
from rag import knowledge_base as kb_module
from rag.config import RAGConfig
from rag.pipeline import Pipeline
from rag.query import Query, collection_names
from rag.types import Document
from tests.rag.corpus import SMALL_CORPUS


def test_a_query_is_checked_where_it_is_made():
    assert Query.of("Who?", None, ["a", "b", "a"], default_top_k=3) == Query("Who?", 3, ("a", "b"))
    for text, top_k, message in (("  ", 2, "query must be a non-empty string"), ("Who?", 0, "top_k must be")):
        with pytest.raises(ValueError, match=message):
            Query.of(text, top_k)
    with pytest.raises(ValueError, match="question must be a non-empty string, got ''"):
        Query.of("", 1, name="question")
    with pytest.raises(ValueError, match="list of names, got the string 'alice'"):
        collection_names("alice")
    with pytest.raises(ValueError, match=r"collection '\.\./x' must be"):
        Query.of("Who?", 1, ["../x"])


@pytest.fixture(scope="module")
def pipeline(loaded_model, embedder, chunker):
    from rag.knowledge_base import KnowledgeBase

    engine = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    config = RAGConfig(max_tokens=2)
    p = Pipeline(
        config, engine=engine, knowledge_base=KnowledgeBase(config, embedder=embedder, chunker=chunker)
    )
    p.add_documents(SMALL_CORPUS[:2], collection="a")
    p.add_documents(SMALL_CORPUS[2:], collection="b")
    yield p
    engine.close()


def test_one_ask_checks_its_question_once_and_builds_no_retriever_twice(pipeline, monkeypatch):
    checks: list[object] = []
    built: list[object] = []
    real_of, real_make = Query.of.__func__, kb_module.make_retriever  # type: ignore[attr-defined]
    monkeypatch.setattr(
        Query, "of", classmethod(lambda cls, *a, **k: checks.append(a[0]) or real_of(cls, *a, **k))
    )
    monkeypatch.setattr(
        kb_module, "make_retriever", lambda *a, **k: built.append(k.get("mode")) or real_make(*a, **k)
    )
    for _ in range(3):
        answer = pipeline.ask("What do cats do when content?", collections=["a", "b"])
        assert answer.sources
    assert checks == ["What do cats do when content?"] * 3  # once per ask
    assert sorted(map(str, built)) == ["None", "dense"]  # the search's and the sources' scores, once each


def test_retrievers_are_rebuilt_when_the_collections_change(pipeline):
    kb = pipeline.kb
    first = kb.retriever("hybrid", collections=["a", "c"])
    assert kb.retriever("hybrid", collections=["a", "c"]) is first
    assert kb.retriever("bm25", collections=["a", "c"]) is not first
    assert not kb.search("Zyqqa lighthouse keeper", 2, "bm25", collections=["c"])
    kb.add_documents([Document(id="c.md", text="The Zyqqa lighthouse keeper rings at noon.")], collection="c")
    again = kb.retriever("hybrid", collections=["a", "c"])
    assert again is not first  # a new collection: its indexes are searched from now on
    assert kb.search("Zyqqa lighthouse keeper", 2, "bm25", collections=["a", "c"])[0].doc_id == "c.md"
    kb.add_documents([Document(id="c2.md", text="Another Zyqqa note.")], collection="c")
    assert kb.retriever("hybrid", collections=["a", "c"]) is again  # same collections: same retriever
