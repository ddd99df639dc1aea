"""Pipeline over collections: answers grounded only on the collections named, and the opt-in public
prefix (system prompt + shared chunks) that namespaces may share."""

from __future__ import annotations

import pytest

from engine import Engine, SamplingParams
from rag.config import RAGConfig
from rag.ingestion.chunking import Chunker
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import Pipeline
from rag.prompt.public import public_prefix_length
from rag.types import Document

ALICE = Document(id="plan.md", text="# Plan\n\nAlice's launch code for the Zorblax project is 4417.")
BOB = Document(id="plan.md", text="# Plan\n\nBob's launch code for the Quillon project is 9021.")
SHARED = [
    Document(id="ferry.md", text="# Ferry\n\nThe Harwick ferry leaves at 7:40; its captain is Noor Adeyemi."),
    Document(id="bridge.md", text="# Bridge\n\nThe Quillon bridge is 212 metres long and painted teal."),
]
SHORT = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    yield eng
    eng.close()


def _pipeline(engine, embedder, llm_tokenizer, **config) -> Pipeline:
    cfg = RAGConfig(max_tokens=8, **config)
    kb = KnowledgeBase(cfg, embedder=embedder, chunker=Chunker(llm_tokenizer))
    p = Pipeline(cfg, engine=engine, knowledge_base=kb)
    p.add_documents([ALICE], collection="alice")
    p.add_documents([BOB], collection="bob")
    p.add_documents(SHARED, collection="shared")
    return p


@pytest.fixture(scope="module")
def pipeline(engine, embedder, llm_tokenizer) -> Pipeline:
    return _pipeline(engine, embedder, llm_tokenizer)


def test_answers_cite_only_the_collections_named(pipeline):
    ans = pipeline.ask("What is the launch code?", top_k=4, namespace="c-bob", collections=["bob", "shared"])
    assert {s.collection for s in ans.sources} <= {"bob", "shared"}
    assert "Zorblax" not in " ".join(s.text for s in ans.sources)
    hits = pipeline.retrieve("Zorblax launch code 4417", top_k=4, collections=["bob"])
    assert [(h.doc_id, h.collection) for h in hits] == [("plan.md", "bob")]
    assert pipeline.retrieve("Zorblax", top_k=2, collections=["nobody"]) == []
    everything = pipeline.retrieve("launch code", top_k=4)  # no collections named: all of them
    assert {h.collection for h in everything} == {"alice", "bob", "shared"} or len(everything) == 4
    with pytest.raises(ValueError, match="list of names"):
        pipeline.ask("q?", collections="bob")  # type: ignore[arg-type]


def test_documents_by_collection(pipeline):
    assert pipeline.get_document("plan.md", collection="alice") == ALICE
    assert pipeline.get_document("plan.md", collection="bob") == BOB
    assert pipeline.get_document("plan.md") is None  # nothing in the default collection
    assert [(d.id, d.collection) for d in pipeline.list_documents(["alice", "bob"])] == [
        ("plan.md", "alice"),
        ("plan.md", "bob"),
    ]
    assert pipeline.collections() == ["alice", "bob", "shared"] and pipeline.count_documents(["shared"]) == 2


def test_the_public_prefix_is_shared_only_when_turned_on(engine, embedder, llm_tokenizer):
    question = "When does the Harwick ferry leave?"
    off = _pipeline(engine, embedder, llm_tokenizer)
    off.ask(question, top_k=1, namespace="off-alice", collections=["shared"], params=SHORT)
    cold = off.ask(question, top_k=1, namespace="off-bob", collections=["shared"], params=SHORT)
    assert cold.usage.cached_tokens == 0  # default: every namespace's cache is its own

    on = _pipeline(engine, embedder, llm_tokenizer, public_collections=["shared"])
    hits = on.retrieve(question, top_k=1, collections=["shared"])
    prompt = on.assemble(question, hits, "on-alice")
    public = public_prefix_length(prompt, {"shared"})
    assert prompt.stable_length < public < len(prompt.token_ids)  # system prompt + the shared chunk
    first = on.ask(question, top_k=1, namespace="on-alice", collections=["shared"], params=SHORT)
    second = on.ask(question, top_k=1, namespace="on-bob", collections=["shared"], params=SHORT)
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == public  # the public part only: not alice's question
    assert second.text == first.text == cold.text  # reuse changes nothing

    mine = on.retrieve("launch code", 1, collections=["alice"])
    mixed = on.assemble(question, [*mine, *hits], "x")
    private_start = next(s.start for s in mixed.segments if s.name == f"chunk:{mine[0].chunk_id}")
    assert public_prefix_length(mixed, {"shared"}) <= private_start  # a private chunk is never public
    private = on.ask("What is the launch code?", top_k=1, namespace="on-carol", collections=["alice"])
    assert private.usage.cached_tokens == prompt.stable_length  # the system prompt only
