"""Recompute strategies: one registered selector per declared name, each keeping to its budget, every
one equal to full prefill when it recomputes everything, and the deviation estimate each reports."""

from __future__ import annotations

import pytest
import torch

from engine.chunks.plan import plan_stitch
from engine.chunks.reuse import LAYERED_STRATEGIES, SHARED_STRATEGIES, STRATEGIES, ChunkReuse
from engine.chunks.selection import SELECTORS, register, selector
from engine.chunks.stitcher import ChunkStitcher
from engine.config import EngineConfig
from engine.kv.buffer_pool import BufferPool
from prefix_cache import RadixCache
from tests.engine.chunks.test_chunks_mode import GREEDY, rag_prompt


@pytest.fixture(scope="module")
def stitch(loaded_model):
    """stitch(policy) -> (Stitched, plan, reference logits) on a three-chunk prompt whose placements are
    cached (the first call computes them)."""
    from engine.fused import FusedLlamaRunner

    runner = FusedLlamaRunner(loaded_model.model)
    ids, spans = rag_prompt(loaded_model.tokenizer, "abc", "Who leads the Zorblax team?")
    cache = RadixCache(1 << 30)
    stitcher = ChunkStitcher(cache, runner, BufferPool(0))
    reference = runner.prefill(ids, runner.new_buffer(len(ids)))

    def run(policy: ChunkReuse):
        plan = plan_stitch(len(ids), spans, cached=0)
        assert plan is not None
        buffer = runner.new_buffer(len(ids))
        runner.prefill(ids[: plan.exact_end], buffer)
        out = stitcher.stitch(buffer, ids, spans, plan, policy, "")
        for key, kv in out.kv.placements:
            cache.insert(key, kv)
        stitcher.recycle(out)
        return out, plan, reference

    run(ChunkReuse("none", 0.0))  # every placement cached from here on
    return run


def test_every_declared_strategy_has_a_selector():
    selector("none")  # loads the built-in ones
    assert sorted(SELECTORS) == sorted(STRATEGIES)
    assert LAYERED_STRATEGIES <= SHARED_STRATEGIES <= set(STRATEGIES)
    with pytest.raises(ValueError, match="no selector for strategy 'sideways'; registered: "):
        selector("sideways")
    with pytest.raises(ValueError, match="not declared"):
        register("sideways")


@pytest.mark.parametrize(
    ("policy", "label"),
    [
        (ChunkReuse("none", 0.0), "none"),
        (ChunkReuse("boundary", 0.3), "boundary"),
        (ChunkReuse("edges", 0.2), "edges 20%"),
        (ChunkReuse("tail", 0.3), "tail 30%"),
        (ChunkReuse("query", 0.1, select_layer=2), "query 10% @2"),
    ],
)
def test_labels_name_the_budget_and_layer_where_they_apply(policy, label):
    assert policy.label == label


def test_engine_config_reads_the_former_layer_name():
    assert EngineConfig(chunk_deviation_layer=3).chunk_select_layer == 3
    assert EngineConfig(chunk_select_layer=2).chunk_reuse().select_layer == 2


@pytest.mark.parametrize("strategy", ["first", "tail", "first_tail", "deviation", "query"])
def test_recomputing_every_reused_token_equals_full_prefill(stitch, strategy):
    out, plan, reference = stitch(ChunkReuse(strategy, 1.0))  # type: ignore[arg-type]
    assert out.recomputed_tokens == plan.reused_tokens and out.stitched_tokens == 0
    assert torch.allclose(out.logits, reference, atol=1e-3)
    assert out.deviation == 0.0  # the question read no stitched KV


@pytest.mark.parametrize("strategy", ["tail", "first_tail", "deviation", "query"])
def test_selecting_strategies_recompute_their_share(stitch, strategy):
    out, plan, _ = stitch(ChunkReuse(strategy, 0.25))  # type: ignore[arg-type]
    assert out.recomputed_tokens == int(0.25 * plan.reused_tokens)  # rounded down: never over
    assert out.stitched_tokens == plan.reused_tokens - out.recomputed_tokens


def test_positional_strategies_recompute_the_ends_of_each_chunk(stitch):
    boundary, plan, _ = stitch(ChunkReuse("boundary"))
    assert boundary.recomputed_tokens == len(plan.runs)  # one per chunk, whatever the share
    first, _, _ = stitch(ChunkReuse("first", 0.2))
    edges, _, _ = stitch(ChunkReuse("edges", 0.2))
    assert 0 < edges.recomputed_tokens <= first.recomputed_tokens + len(plan.runs)


def test_query_recomputes_the_reused_tokens_the_question_attends_to_most(loaded_model):
    """The picks are the top share of the question's attention at the selection layer, over the
    stitched keys (the same first pass the selector runs, read back)."""
    from engine.chunks.selection import StitchContext
    from engine.chunks.stitch import StitchedPrefill
    from engine.fused import FusedLlamaRunner

    runner = FusedLlamaRunner(loaded_model.model)
    ids, spans = rag_prompt(loaded_model.tokenizer, "abc", "Who leads the Zorblax team?")
    stitcher = ChunkStitcher(RadixCache(1 << 30), runner, BufferPool(0))
    plan = plan_stitch(len(ids), spans, cached=0)
    assert plan is not None
    buffer = runner.new_buffer(len(ids))
    runner.prefill(ids[: plan.exact_end], buffer)
    kv = stitcher.sources.fetch(ids, spans, plan, buffer, "")
    stitcher._place(buffer, plan, kv)
    policy = ChunkReuse("query", 0.2, select_layer=2)
    always = torch.tensor(plan.computed_positions())
    ctx = StitchContext(StitchedPrefill(runner), buffer, ids, plan, policy, always)
    picks = selector("query").select(ctx).picks
    x = ctx.prefill.forward(buffer, ctx.prefill.embed(ids, always), always, range(2))
    mass = ctx.prefill.attention_mass(buffer, x, always, 2, always >= plan.runs[-1].end)[ctx.reused]
    chosen = torch.isin(ctx.reused, torch.tensor(picks))
    assert len(picks) == int(0.2 * plan.reused_tokens)
    assert mass[chosen].min() >= mass[~chosen].max() and bool(torch.isfinite(mass).all())


def test_deviation_estimate_shrinks_as_more_is_recomputed(stitch):
    naive, _, _ = stitch(ChunkReuse("none", 0.0))
    half, _, _ = stitch(ChunkReuse("query", 0.5))
    assert 0 < naive.deviation < 1
    assert 0 <= half.deviation < naive.deviation


@pytest.fixture(scope="module")
def engine_chunks(loaded_model):
    from engine import Engine

    config = EngineConfig(model=loaded_model.model_id, reuse="chunks")
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    yield eng
    eng.close()


def test_chunks_mode_results_carry_the_estimate(engine_chunks):
    ids, spans = rag_prompt(engine_chunks.tokenizer, "abc")
    engine_chunks.generate(ids, GREEDY, namespace="estimate", chunk_spans=spans)  # caches b and c
    ids, spans = rag_prompt(engine_chunks.tokenizer, "cab")
    r = engine_chunks.generate(ids, GREEDY, namespace="estimate", chunk_spans=spans)
    assert r.stitched_tokens > 0 and r.stitch_deviation is not None and 0 < r.stitch_deviation < 1
    exact = engine_chunks.generate(ids, GREEDY, namespace="estimate", chunk_spans=spans, reuse="prefix")
    assert exact.stitch_deviation is None


def test_tail_recomputes_the_reused_tokens_nearest_the_question():
    from engine.chunks.positional import tail_tokens

    plan = plan_stitch(60, [(2, 12), (13, 23), (24, 44), (45, 55)], cached=0)
    reused = [p for run in plan.runs for p in range(run.start, run.end)]
    picks = tail_tokens(plan, 0.5)
    assert picks == reused[-len(reused) // 2 :] and picks[-1] == 54  # the last chunk whole, then back
    assert tail_tokens(plan, 0.0) == [] and tail_tokens(plan, 0.01) == [54]


def test_first_tail_gives_each_chunk_its_sink_and_the_rest_of_the_budget_to_the_tail():
    from engine.chunks.positional import first_tail_tokens, first_tokens

    plan = plan_stitch(60, [(2, 12), (13, 23), (24, 44), (45, 55)], cached=0)
    picks = first_tail_tokens(plan, 0.4)
    heads = first_tokens(plan, 0.2)
    assert set(heads) < set(picks) and len(picks) == int(0.4 * plan.reused_tokens)
    tail = sorted(set(picks) - set(heads))
    assert tail[-1] == 54 and tail == list(
        range(tail[0], 55)
    )  # the rest: the reused tokens nearest the question
