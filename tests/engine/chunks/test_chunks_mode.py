"""Chunks mode with the real bundled model: RoPE re-rotation, stitching, and the invariants it must keep
(exact mode never reads stitched KV, tenants, locks, eviction, cancellation, batched decode, fallback)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from engine import Engine, EngineConfig, SamplingParams
from engine.chunks.plan import plan_stitch
from engine.chunks.reuse import ChunkReuse
from engine.chunks.stitch import rotate_keys, rotation
from engine.chunks.stitcher import ChunkStitcher
from engine.kv.buffer_pool import BufferPool
from engine.request import final_result
from prefix_cache import RadixCache

GREEDY = SamplingParams(max_tokens=8)
SYSTEM = "<|im_start|>system\nAnswer from the numbered passages.<|im_end|>\n<|im_start|>user\n"
PASSAGES = {
    "a": "The Zorblax project started in 2019 in Lyon. Its secret code is 4417, and the team meets every "
    "Tuesday in a room on the third floor of the old library.",
    "b": "Ada Brennan leads the Zorblax team of nine engineers. She joined in 2020 after ten years of work "
    "on compilers and a short time at a start-up that built weather models.",
    "c": "The Zorblax budget for 2024 is 1.2 million euros, most of it for hardware. The review board "
    "approves spending above fifty thousand euros in its monthly meeting.",
}


STAND_IN = " (source: reference)\nGeneral notes on how the records are kept, which terms they use and where the details are."


def stand_in_context(tokenizer) -> list[int]:
    """A chunk context as the assembler makes one: a stand-in passage, then the second marker."""
    return (
        tokenizer(STAND_IN, add_special_tokens=False)["input_ids"]
        + tokenizer("\n\n[2]", add_special_tokens=False)["input_ids"]
    )


def rag_prompt(tokenizer, order: str, question: str = "What is the secret code?") -> tuple[list[int], list]:
    """[system][[1] body][\\n\\n[2] body]...[question], each piece tokenized on its own (as the assembler
    does); returns the ids and the bodies' spans."""

    def enc(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = enc(SYSTEM)
    spans = []
    for n, name in enumerate(order):
        ids += enc(("\n\n" if n else "") + f"[{n + 1}]")
        body = enc(f" (source: {name})\n{PASSAGES[name]}")
        spans.append((len(ids), len(ids) + len(body)))
        ids += body
    ids += enc(f"\n\nQuestion: {question}") + enc("<|im_end|>\n<|im_start|>assistant\n")
    return ids, spans


@pytest.fixture(scope="module")
def engine_chunks(loaded_model):
    config = EngineConfig(model=loaded_model.model_id, reuse="chunks", chunk_recompute="first")
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    yield eng
    eng.close()


@pytest.mark.numerics
def test_a_rotated_key_is_the_key_at_the_new_position(engine):
    runner = engine.runner
    ids, _ = rag_prompt(engine.tokenizer, "ab")
    here, there = engine.runner.new_buffer(256), engine.runner.new_buffer(256)
    runner.prefill(ids[40:80], here)
    runner.prefill([0] * 57 + ids[40:80], there)  # the same tokens 57 positions on
    keys = here.stores()[0][0, 0, :, :40]  # layer 0: a key depends on its token and position only
    moved = rotate_keys(keys, *rotation(runner, 57))
    fresh = there.stores()[0][0, 0, :, 57:97]
    assert torch.allclose(moved, fresh, atol=1e-4 * float(fresh.abs().max()))
    cos_a, sin_a = rotation(runner, 300)
    twice = rotate_keys(rotate_keys(keys, cos_a, sin_a), *rotation(runner, 57))
    assert torch.allclose(
        twice, rotate_keys(keys, *rotation(runner, 357)), atol=1e-4 * float(fresh.abs().max())
    )


@pytest.mark.parametrize("with_context", [False, True])
def test_recomputing_every_reused_token_equals_full_prefill(engine, with_context):
    runner = engine.runner
    ids, spans = rag_prompt(engine.tokenizer, "abc")
    context = stand_in_context(engine.tokenizer) if with_context else []
    cache = RadixCache(1 << 30)
    stitcher = ChunkStitcher(cache, runner, BufferPool(0))
    reference = runner.prefill(ids, runner.new_buffer(len(ids)))
    results = {}
    for share in (0.0, 1.0, 0.0):  # the first pass prefills the placements, the others reuse them
        plan = plan_stitch(len(ids), spans, cached=0, context=context)
        assert plan is not None and len(plan.runs) == 2
        buffer = runner.new_buffer(len(ids))
        runner.prefill(ids[: plan.exact_end], buffer)
        out = stitcher.stitch(buffer, ids, spans, plan, ChunkReuse("first", share), "")
        for key, kv in out.kv.placements:
            cache.insert(key, kv)
        stitcher.recycle(out)
        results[share] = out.logits
        placed = out.prefilled_tokens - (len(context) if out.prefilled_tokens else 0)  # once, if at all
        assert placed + out.stitched_tokens + out.recomputed_tokens == plan.reused_tokens
        assert out.recomputed_tokens == (plan.reused_tokens if share else 0)
    assert torch.allclose(results[1.0], reference, atol=1e-3)
    assert not torch.allclose(results[0.0], reference, atol=1e-3)  # the naive stitch does change them


def test_chunks_are_reused_wherever_they_stand(engine_chunks):
    ns = "reuse"
    first_ids, first_spans = rag_prompt(engine_chunks.tokenizer, "abc")
    cold = engine_chunks.generate(first_ids, GREEDY, namespace=ns, chunk_spans=first_spans)
    assert cold.reuse == "chunks" and cold.stitched_tokens == 0  # b and c prefilled at their placements
    ids, spans = rag_prompt(engine_chunks.tokenizer, "cab", "Who leads the team?")
    before = engine_chunks.stats()["stitched_tokens"]
    queried = engine_chunks.cache_stats(ns).query_tokens
    warm = engine_chunks.generate(ids, GREEDY, namespace=ns, chunk_spans=spans)
    # the chunk placements' lookups are not prompt matches: only the prompt's own match counts
    assert engine_chunks.cache_stats(ns).query_tokens == queried + len(ids) - 1
    reused = sum(e - s for s, e in spans[1:])
    assert warm.stitched_tokens + warm.recomputed_tokens == reused  # a and b: from their placements
    assert warm.recomputed_tokens > 0
    assert (
        warm.cached_tokens == spans[0][1]
    )  # exact: the anchor and c, whose placement the first request made
    assert engine_chunks.stats()["stitched_tokens"] == before + warm.stitched_tokens
    prefix = engine_chunks.generate(ids, GREEDY, namespace=ns, chunk_spans=spans, reuse="prefix")
    assert prefix.reuse == "prefix" and prefix.stitched_tokens == 0


def test_a_chunk_context_places_chunks_after_it_once(engine_chunks):
    """With ``chunk_context`` a reused chunk's KV is computed (and cached) after ``anchor + context``;
    the context is prefilled once and shared by every chunk's placement, and the placements are exact."""
    ns, runner = "context", engine_chunks.runner
    context = stand_in_context(engine_chunks.tokenizer)
    ids, spans = rag_prompt(engine_chunks.tokenizer, "abc")
    cold = engine_chunks.generate(ids, GREEDY, namespace=ns, chunk_spans=spans, chunk_context=context)
    bodies = {name: ids[s:e] for name, (s, e) in zip("abc", spans, strict=True)}
    assert cold.chunk_prefill_tokens == len(context) + len(bodies["b"]) + len(bodies["c"])
    anchor = ids[: spans[0][0]]
    full_ns = engine_chunks._namespace(ns)
    key = anchor + context + bodies["c"]
    hit = engine_chunks.cache.match_prefix(key, namespace=full_ns)
    assert hit.length == len(key)
    placed, fresh = runner.new_buffer(len(key)), runner.new_buffer(len(key))
    placed.load_prefix(hit.values)
    runner.prefill(key, fresh)
    close(placed.stores()[0][:, :, :, : len(key)], fresh.stores()[0][:, :, :, : len(key)])
    again, again_spans = rag_prompt(engine_chunks.tokenizer, "cab", "Who leads the team?")
    warm = engine_chunks.generate(again, GREEDY, namespace=ns, chunk_spans=again_spans, chunk_context=context)
    shared = next(i for i, (x, y) in enumerate(zip(bodies["a"], bodies["b"])) if x != y)  # " (source: "
    assert warm.chunk_prefill_tokens == len(bodies["a"]) - shared  # the context and b's placement: cached
    assert warm.stitched_tokens + warm.recomputed_tokens == len(bodies["b"])
    plain = engine_chunks.generate(again, GREEDY, namespace=ns, chunk_spans=again_spans)
    # no context: anchor + a is cached (the first prompt began with it), anchor + b is new
    assert plain.chunk_prefill_tokens == len(bodies["b"]) - shared


def test_exact_mode_never_reads_stitched_kv(engine_chunks, engine_nocache):
    ns = "exact-after-chunks"
    runner = engine_chunks.runner
    first, first_spans = rag_prompt(engine_chunks.tokenizer, "bca")
    engine_chunks.generate(first, GREEDY, namespace=ns, chunk_spans=first_spans)
    ids, spans = rag_prompt(engine_chunks.tokenizer, "abc")
    engine_chunks.generate(ids, GREEDY, namespace=ns, chunk_spans=spans)
    # the first prompt cached anchor + a (a's placement): the marker after a and everything after it
    # were computed in the stitched pass, so the cache holds the exact part up to a's end
    exact_end = spans[0][1]
    full_ns = engine_chunks._namespace(ns)
    assert engine_chunks.cache.peek_length(ids, namespace=full_ns) == exact_end
    fresh = runner.new_buffer(len(ids))
    runner.prefill(ids, fresh)
    match = engine_chunks.cache.match_prefix(ids, namespace=full_ns)
    cached = runner.new_buffer(len(ids))
    cached.load_prefix(match.values)
    for part in (0, 1):  # keys, values: equal to full prefill's (the tolerance exact reuse is held to)
        close(cached.stores()[part][:, :, :, :exact_end], fresh.stores()[part][:, :, :, :exact_end])
    for name in "bc":  # the placements computed on the way are exact too
        alone_ids, alone_spans = rag_prompt(engine_chunks.tokenizer, name)
        key = alone_ids[: alone_spans[0][1]]  # the anchor and the chunk's body
        hit = engine_chunks.cache.match_prefix(key, namespace=full_ns)
        assert hit.length == len(key)
        placed, alone = runner.new_buffer(len(key)), runner.new_buffer(len(key))
        placed.load_prefix(hit.values)
        runner.prefill(key, alone)
        close(placed.stores()[0][:, :, :, : len(key)], alone.stores()[0][:, :, :, : len(key)])
    # the stitched request's recycled buffer hands on its exact part alone
    held = engine_chunks.stats()["held_tokens"]
    exact = engine_chunks.generate(ids, GREEDY, namespace=ns, reuse="prefix")
    assert engine_chunks.stats()["held_tokens"] - held == exact_end
    assert exact.token_ids == engine_nocache.generate(ids, GREEDY).token_ids


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-3, rtol=0)


def test_tenants_do_not_share_chunks(engine_chunks):
    ids, spans = rag_prompt(engine_chunks.tokenizer, "abc")
    engine_chunks.generate(ids, GREEDY, namespace="tenant-a", chunk_spans=spans)
    other, other_spans = rag_prompt(engine_chunks.tokenizer, "cba")
    before = engine_chunks.stats()["chunk_prefill_tokens"]
    r = engine_chunks.generate(other, GREEDY, namespace="tenant-b", chunk_spans=other_spans)
    assert r.stitched_tokens == 0 and r.cached_tokens == 0
    assert engine_chunks.stats()["chunk_prefill_tokens"] == before + sum(e - s for s, e in other_spans[1:])


def test_cancelled_chunks_request_releases_its_locks(engine_chunks):
    ids, spans = rag_prompt(engine_chunks.tokenizer, "bac")
    stream = engine_chunks.stream(ids, SamplingParams(max_tokens=200), namespace="cancel", chunk_spans=spans)
    next(stream)
    stream.close()
    unstarted = engine_chunks.stream(
        ids, SamplingParams(max_tokens=200), namespace="cancel", chunk_spans=spans
    )
    unstarted.close()
    assert engine_chunks.cache.stats().protected_bytes == 0
    assert engine_chunks.stats()["running"] == 0


def test_tight_budget_evicts_and_never_overflows(loaded_model):
    bytes_per_token = 2 * 30 * 3 * 64 * 4
    config = EngineConfig(
        model=loaded_model.model_id, reuse="chunks", cache_bytes=120 * bytes_per_token, kv_slab_bytes=0
    )
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        for order in ("abc", "cab", "bca", "acb"):
            ids, spans = rag_prompt(eng.tokenizer, order)
            r = eng.generate(ids, SamplingParams(max_tokens=2), chunk_spans=spans)
            assert r.finish_reason in ("stop", "length")
            stats = eng.cache.stats()
            assert stats.used_bytes <= eng.cache.capacity_bytes and stats.protected_bytes == 0
        assert eng.cache.stats().evictions > 0
    finally:
        eng.close()


def test_batched_chunks_requests_equal_sequential_ones(loaded_model):
    config = EngineConfig(model=loaded_model.model_id, reuse="chunks", batch_invariant=True)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        prompts = [rag_prompt(eng.tokenizer, order) for order in ("abc", "bca", "cab")]
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        ids, spans = prompts[0]
        eng.generate(ids, params, chunk_spans=spans)  # every placement cached
        sequential = [eng.generate(ids, params, chunk_spans=spans).token_ids for ids, spans in prompts]
        results: list = [None] * 3

        def run(i: int) -> None:
            ids, spans = prompts[i]
            results[i] = eng.generate(ids, params, chunk_spans=spans).token_ids

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == sequential
    finally:
        eng.close()


def test_deviation_recomputes_its_share(engine_chunks):
    ids, spans = rag_prompt(engine_chunks.tokenizer, "abc")
    engine_chunks.generate(ids, GREEDY, namespace="deviation", chunk_spans=spans)
    policy = ChunkReuse("deviation", 0.25, select_layer=2)
    r = engine_chunks.generate(ids, GREEDY, namespace="deviation", chunk_spans=spans, reuse=policy)
    reused = sum(e - s for s, e in spans[1:])
    assert r.recomputed_tokens == int(0.25 * reused)  # rounded down: never over the share
    assert r.stitched_tokens == reused - r.recomputed_tokens


def test_prompt_ending_in_a_chunk_still_computes_its_last_token(engine_chunks):
    ids, spans = rag_prompt(engine_chunks.tokenizer, "ab")
    body_end = spans[-1][1]
    engine_chunks.generate(ids, GREEDY, namespace="tail", chunk_spans=spans)
    r = engine_chunks.generate(ids[:body_end], GREEDY, namespace="tail", chunk_spans=spans)
    assert r.stitched_tokens == spans[1][1] - spans[1][0] - 1 - r.recomputed_tokens


def test_bad_reuse_options_are_value_errors(engine_chunks):
    ids, _ = rag_prompt(engine_chunks.tokenizer, "ab")
    with pytest.raises(ValueError, match="reuse must be one of"):
        engine_chunks.submit(ids, GREEDY, reuse="sideways")
    with pytest.raises(ValueError, match="within the prompt"):
        engine_chunks.submit(ids, GREEDY, chunk_spans=[(5, len(ids) + 3)])
    with pytest.raises(ValueError, match="chunk_context must hold token ids"):
        engine_chunks.submit(ids, GREEDY, chunk_context=[1, -4])
    with pytest.raises(ValueError, match="chunk_context must be a list"):
        engine_chunks.submit(ids, GREEDY, chunk_context="[2]")
    with pytest.raises(ValueError, match="exceed the model's context"):
        engine_chunks.submit(ids, GREEDY, chunk_context=[1] * engine_chunks.max_context)
    with pytest.raises(ValueError, match="share"):
        ChunkReuse("first", 1.5)


def _tiny_engine(model, **options):
    class Tok:
        eos_token_id = None
        chat_template = None

        def decode(self, ids, skip_special_tokens=True):
            return "".join(f" {i}" for i in ids)

    config = EngineConfig(model="tiny", reuse="chunks", **options)
    return Engine(model, Tok(), model_id="tiny", config=config)


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)), "fused"),
        (
            lambda: LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=64,
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                )
            ),
            "rope type 'dynamic'",
        ),
    ],
)
def test_unsupported_models_fall_back_to_prefix_with_a_reason(build, reason, caplog):
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="engine.engine"):
        eng = _tiny_engine(build().eval())
    try:
        assert eng.chunks_blocker is not None and reason in eng.chunks_blocker
        assert reason in caplog.text
        r = eng.generate(list(range(1, 20)), SamplingParams(max_tokens=2), chunk_spans=[(4, 9), (10, 15)])
        assert r.reuse == "prefix" and r.stitched_tokens == 0
    finally:
        eng.close()


def test_caching_off_falls_back(loaded_model):
    config = EngineConfig(model=loaded_model.model_id, reuse="chunks", enable_prefix_cache=False)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        assert eng.chunks_blocker == "prefix caching is off (nothing to reuse)"
    finally:
        eng.close()


def test_score_feeds_the_continuation_and_returns_each_next_token_distribution(engine_nocache):
    ids, _ = rag_prompt(engine_nocache.tokenizer, "ab")
    greedy = engine_nocache.generate(ids, SamplingParams(max_tokens=6, ignore_eos=True)).token_ids
    scored = final_result(engine_nocache.score(ids, greedy))
    assert scored.scores.shape == (6, engine_nocache.runner.vocab_size)
    assert scored.token_ids == greedy
    assert scored.scores.argmax(-1).tolist() == greedy  # greedy picks each row's most likely token
    full = engine_nocache.runner.prefill(ids, engine_nocache.runner.new_buffer(len(ids)))
    close(scored.scores[0], torch.log_softmax(full, -1))
    with pytest.raises(ValueError, match="continuation is empty"):
        engine_nocache.score(ids, [])


def test_chunk_placements_come_back_from_the_disk_tier_after_a_restart(loaded_model, tmp_path):
    """A placement computed before a restart is read from the disk tier (not prefilled again), promoted
    into RAM, and the stitched answer is the one the first engine gave."""
    config = EngineConfig(
        model=loaded_model.model_id, reuse="chunks", chunk_recompute="first", disk_cache_dir=tmp_path
    )
    first_ids, first_spans = rag_prompt(loaded_model.tokenizer, "abc")
    ids, spans = rag_prompt(loaded_model.tokenizer, "cab", "Who leads the team?")
    answers = []
    for run in ("before", "after"):
        eng = Engine(
            loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config
        )
        try:
            if run == "before":  # computes the placements of b and c, and a's as the first chunk
                eng.generate(first_ids, GREEDY, namespace="t", chunk_spans=first_spans)
            answer = eng.generate(ids, GREEDY, namespace="t", chunk_spans=spans)
            assert eng.disk is not None and eng.disk.flush(60)
        finally:
            eng.close()
        answers.append(answer)
    before, after = answers
    assert after.stitched_tokens == before.stitched_tokens > 0
    assert after.chunk_prefill_tokens == 0  # every reused chunk's placement came from disk
    assert after.text == before.text


def test_stitched_kv_is_in_the_storage_format(loaded_model):
    """With a compact kv_dtype, every K/V a stitched prefill leaves (re-rotated keys, recomputed tokens,
    the question) is already in that format: attention read what the cache would store."""
    from engine.fused import FusedLlamaRunner
    from engine.kv.codec import make_codec

    codec = make_codec("int8", torch.float32)
    runner = FusedLlamaRunner(loaded_model.model, kv_codec=codec)
    ids, spans = rag_prompt(loaded_model.tokenizer, "abc")
    cache = RadixCache(1 << 30)
    stitcher = ChunkStitcher(cache, runner, BufferPool(0))
    for _ in range(2):  # the first pass prefills the placements, the second stitches them
        plan = plan_stitch(len(ids), spans, cached=0)
        assert plan is not None
        buffer = runner.new_buffer(len(ids))
        runner.prefill(ids[: plan.exact_end], buffer)
        out = stitcher.stitch(buffer, ids, spans, plan, ChunkReuse("first", 0.2), "")
        for key, kv in out.kv.placements:
            cache.insert(key, kv)
        stitcher.recycle(out)
    assert out.stitched_tokens > 0 and out.recomputed_tokens > 0
    for store in buffer.stores():
        held = store[:, :, :, : len(ids)]
        assert torch.equal(codec.round(held), held)
