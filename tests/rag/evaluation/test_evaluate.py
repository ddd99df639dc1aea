"""The measured defaults must beat dense retrieval on the labelled questions.

Embedding the whole bundled corpus (~600 chunks) takes 35-120 s on this project's 2-core machines,
so the comparison runs on the topics shorter than 10,000 characters (~215 chunks) and the questions
that have a relevant topic among them; `prefixrag eval-retrieval --questions
rag/data/eval_questions.json --split all` runs the full set.
"""

from __future__ import annotations

import pytest

from rag.evaluation.evaluate import EvalQuestion, EvalSetting, evaluate, load_eval_questions, recall_at
from rag.ingestion.chunking import Chunker
from rag.ingestion.loaders import load_python_reference
from rag.knowledge_base import KnowledgeBase
from rag.types import ScoredChunk

MAX_TOPIC_CHARS = 10_000


def test_shipped_questions_are_well_formed():
    from pydoc_data.topics import topics

    questions = load_eval_questions()
    assert len(questions) >= 40
    assert len({q.id for q in questions}) == len({q.question for q in questions}) == len(questions)
    assert all(q.topics & set(topics) for q in questions)


def test_recall_at_k():
    questions = [EvalQuestion("a", "q1", frozenset({"t1"})), EvalQuestion("b", "q2", frozenset({"t2"}))]

    def hit(topic: str) -> ScoredChunk:
        return ScoredChunk(doc_id=topic, chunk_id=topic, score=1.0, text="", metadata={"topic": topic})

    results = [[hit("x"), hit("t1")], [hit("t2")]]
    assert recall_at(results, questions, 1) == 0.5
    assert recall_at(results, questions, 2) == 1.0
    with pytest.raises(ValueError, match="result lists"):
        recall_at(results[:1], questions, 1)


@pytest.fixture(scope="module")
def subset(embedder, llm_tokenizer):
    docs = [d for d in load_python_reference() if len(d.text) < MAX_TOPIC_CHARS]
    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer))
    kb.add_documents(docs)
    kept = {d.id for d in docs}
    questions = [q for q in load_eval_questions() if q.topics & kept]
    return kb, questions


def test_default_beats_dense_baseline(subset):
    kb, questions = subset
    assert len(questions) >= 40 and kb.n_chunks > 150
    dense, default = evaluate(kb, questions, [EvalSetting("dense", "dense"), EvalSetting("default")])
    print(
        f"\n{len(questions)} questions, {kb.n_chunks} chunks: dense {dense.recall}, default {default.recall}"
    )
    assert default.recall[1] > dense.recall[1]
    assert default.recall[4] >= dense.recall[4] - 0.05


def test_prefetched_query_vectors_are_the_embedders_own_and_each_question_is_embedded_once(embedder):
    from rag.evaluation.evaluate import QueryVectorMemo

    class Counting:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def embed(self, texts):
            self.texts += texts
            return embedder.embed(texts)

        def embed_query(self, text):
            self.texts.append(text)
            return embedder.embed_query(text)

    questions = ["what does pass do?", "how is a with statement run?", "what does pass do?"]
    counting = Counting()
    memo = QueryVectorMemo(counting)
    memo.prefetch(questions)
    vectors = [memo.embed_query(q) for q in questions]
    assert counting.texts == questions[:2]  # one batch, each text once, nothing embedded again
    for question, vector in zip(questions, vectors, strict=True):
        assert abs(vector - embedder.embed_query(question)).max() < 1e-6  # batched = alone, to rounding
        assert not vector.flags.writeable
