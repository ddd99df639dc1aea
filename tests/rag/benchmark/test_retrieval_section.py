"""The benchmark's retrieval section on a few short topics: every method compared with intervals,
the synthetic scale run, the markdown section, and the figures it states."""

from __future__ import annotations

import json

import pytest

from rag.benchmark.retrieval_report import retrieval_section
from rag.benchmark.retrieval_scale import ScaleSpec, run_scale, synthetic_corpus
from rag.evaluation.comparison import DEFAULT, PLAIN, RERANK, compare_methods
from rag.evaluation.eval_set import load_retrieval_eval
from rag.evaluation.variants import kb_parts
from rag.ingestion.chunking import Chunker
from rag.ingestion.loaders import load_python_reference
from rag.knowledge_base import KnowledgeBase
from rag.retrieval.index import EF_SEARCH

TOPICS = {
    "assert",
    "break",
    "continue",
    "pass",
    "del",
    "global",
    "nonlocal",
    "return",
    "lambda",
    "yield",
    "power",
}


@pytest.fixture(scope="module")
def section(embedder, llm_tokenizer):
    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer, 96, 16))
    kb.add_documents([d for d in load_python_reference() if d.id in TOPICS])
    questions = [q for q in load_retrieval_eval("all") if q.primary in TOPICS]
    methods = compare_methods(kb, questions, split="all", rerankers=False, resamples=200)
    scale = run_scale(kb, questions[:12], ScaleSpec(chunks=2000, ef_sweep=(16, 128)))
    return kb, questions, {"retrieval_section": {"methods": methods, "scale": scale}}


def test_every_method_has_recall_mrr_and_intervals(section):
    kb, questions, res = section
    methods = res["retrieval_section"]["methods"]
    names = [r["name"] for r in methods["rows"]]
    assert names[-1] == DEFAULT and PLAIN in names and RERANK not in names and len(names) == len(set(names))
    assert methods["questions"] == len(questions) >= 25 and methods["chunks"] == kb.n_chunks
    for row in methods["rows"]:
        r1, r4, r10 = (row["recall"][k] for k in ("1", "4", "10"))
        assert 0.0 <= r1 <= r4 <= r10 <= 1.0 and r1 <= row["mrr"] <= 1.0
        for metric, value in (("recall@1", r1), ("recall@4", r4), ("mrr", row["mrr"])):
            lo, hi = row["intervals"][metric]
            assert lo <= value <= hi
        assert (
            1.0 <= row["documents4"] <= 4.0 and 0.0 <= row["coverage4"] <= 1.0 and row["context_tokens4"] > 0
        )
    rows = {r["name"]: r for r in methods["rows"]}
    assert rows["hybrid weighted + diversity"]["documents4"] == 4.0  # 11 topics: 4 distinct always fit
    assert rows[DEFAULT]["recall"] == rows["hybrid weighted + diversity"]["recall"]  # the default is that


def test_latency_is_split_into_embedding_and_search(section):
    _, _, res = section
    for name, t in res["retrieval_section"]["methods"]["latency_ms"].items():
        assert t["p50"] <= t["p95"] and t["search_p50"] >= 0.0, name
        assert t["embed_p50"] == 0.0 if name == "bm25" else t["embed_p50"] > 0.0


def test_scale_run_measures_hnsw_against_exact_search(section):
    _, _, res = section
    scale = res["retrieval_section"]["scale"]
    assert [p["ef_search"] for p in scale["ef_sweep"]] == [16, 128] and scale["ef_search"] == EF_SEARCH
    assert all(0.0 <= p["recall"] <= 1.0 for p in scale["ef_sweep"])
    assert scale["recall"] >= 0.9  # 2,000 vectors: HNSW at the default breadth is all but exact
    assert scale["latency_ms"]["hnsw"]["queries"] == 12 and len(scale["targets"]) == 2


def test_synthetic_corpus_is_shaped_like_the_real_one(section):
    kb, _, _ = section
    parts = kb_parts(kb)
    corpus = synthetic_corpus(parts, ScaleSpec(chunks=300, chunks_per_document=5, seed=1))
    assert len(corpus.ids) == len(corpus.chunks) == 300 and corpus.vectors.shape == (300, parts.index.dim)
    assert abs(float((corpus.vectors**2).sum(axis=1).mean()) - 1.0) < 1e-4
    assert len({c.doc_id for c in corpus.chunks.values()}) == 60
    vocabulary = {w for c in parts.chunks.values() for w in c.text.split()}
    assert all(set(c.text.split()) <= vocabulary for c in corpus.chunks.values())
    again = synthetic_corpus(parts, ScaleSpec(chunks=300, chunks_per_document=5, seed=1))
    assert (again.vectors == corpus.vectors).all()  # seeded


def test_the_cli_tables_show_every_method(section):
    from rich.console import Console

    from rag.evaluation.cli import comparison_table, latency_table

    _, _, res = section
    methods = res["retrieval_section"]["methods"]
    console = Console(record=True, width=250)
    console.print(comparison_table(methods))
    console.print(latency_table(methods))
    text = console.export_text()
    for row in methods["rows"]:
        assert row["name"] in text and f"{row['recall']['4']:.3f}" in text
    assert all(name in text for name in methods["latency_ms"])


def test_the_markdown_section_states_the_figures(section):
    _, _, res = section
    json.dumps(res)  # plain JSON: it goes into results.json
    text = retrieval_section(res)
    methods = res["retrieval_section"]["methods"]
    for row in methods["rows"]:
        assert f"| {row['name']} | {row['recall']['1']:.3f} [" in text
    for target in [*methods["targets"], *res["retrieval_section"]["scale"]["targets"]]:
        assert target["target"] in text
    assert "Not run" in retrieval_section({"retrieval_section": None})
