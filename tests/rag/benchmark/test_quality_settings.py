"""Which answer-quality rows run on every question and which on the slice, by default and with --full."""

from __future__ import annotations

from engine.chunks.reuse import SHARED_STRATEGIES, ChunkReuse
from rag.benchmark.cli import bench_config
from rag.benchmark.quality_settings import REFERENCE, quality_settings


def _every_question(full: bool) -> set[str]:
    rows = quality_settings(bench_config(False, {"full": full}))
    assert rows[0].name == REFERENCE
    return {r.name for r in rows if not r.matrix}


def test_default_run_asks_every_question_of_the_reference_the_warm_prefix_and_the_engine_default():
    default_chunks = f"chunks, {ChunkReuse().label}"
    reranked = "full prefill, embedding reranker"  # every question it runs: the corpus ones
    assert _every_question(False) == {
        REFERENCE,
        "prefix, cache order, after warm()",
        default_chunks,
        reranked,
    }


def test_the_retrieval_row_is_the_other_choice_than_the_default():
    config = bench_config(False, {"full": False})
    plain, reranking = (
        next(r for r in quality_settings(config, reranks=flag) if r.group == "retrieval")
        for flag in (False, True)
    )
    assert (plain.name, plain.rerank) == ("full prefill, embedding reranker", True)
    assert (reranking.name, reranking.rerank) == ("full prefill, first stage only", False)


def test_quick_leaves_out_the_embedding_reranker_row():
    quick = bench_config(True, {})
    assert not [r for r in quality_settings(quick) if r.group == "retrieval"]
    first_stage = [r for r in quality_settings(quick, reranks=True) if r.group == "retrieval"]
    assert [r.name for r in first_stage] == ["full prefill, first stage only"]


def test_full_run_asks_every_question_of_every_strategy_at_the_default_budget_only():
    rows = quality_settings(bench_config(False, {"full": True}))
    chunks = [r for r in rows if r.group == "chunks"]
    default_share = ChunkReuse().share
    assert {r.reuse.strategy for r in chunks if not r.matrix} == {r.reuse.strategy for r in chunks}
    for r in chunks:  # budgeted strategies at the other budgets stay on the slice
        at_default = r.reuse.strategy not in SHARED_STRATEGIES or r.reuse.share == default_share
        assert r.matrix != at_default, r.name
    assert _every_question(False) < _every_question(True)
