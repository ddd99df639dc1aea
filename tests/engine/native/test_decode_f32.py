"""The float32 native decode step (engine/native/decode_step_f32.cpp, AVX2 + FMA): the layer loop's
greedy answers, logits within float32 rounding of the loop's, a row independent of its batch mates,
the same bits at any thread count, the weights held once (the prefill's packed tiles), the same bits
at either vector width, and the engine stating that it runs."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.native import decode as native_decode
from engine.native.decode import AVX2_FLAGS, NativeDecode, unavailable_reason
from tests.engine.native.test_decode import PROMPTS, _decode, _prompt, one_thread_logits, store_refusal

HAS_CPU = all(flag in cpu_flags() for flag in AVX2_FLAGS)
needs_cpu = pytest.mark.skipif(not HAS_CPU, reason="the CPU lacks AVX2/FMA: the layer loop runs (stated)")


@pytest.fixture(scope="module")
def runner(loaded_model):
    fused = FusedLlamaRunner(loaded_model.model)
    assert fused.native is not None, fused.native_reason
    return fused


@needs_cpu
def test_greedy_answers_and_logits_are_the_layer_loops(runner, loaded_model):
    for text in PROMPTS:
        ids = _prompt(loaded_model, text)
        native_tokens, native_rows = _decode(runner, ids, 16, native=True)
        loop_tokens, loop_rows = _decode(runner, ids, 16, native=False)
        assert native_tokens == loop_tokens, text
        for native, loop in zip(native_rows, loop_rows):  # float32 sums in another order
            assert torch.allclose(native, loop, rtol=0, atol=2e-3), float((native - loop).abs().max())


@needs_cpu
def test_long_context_attention_matches_the_layer_loop(runner, loaded_model):
    ids = (_prompt(loaded_model, " ".join(PROMPTS)) * 60)[:1500]  # attention over 1,500 keys
    native_tokens, native_rows = _decode(runner, ids, 4, native=True)
    loop_tokens, loop_rows = _decode(runner, ids, 4, native=False)
    assert native_tokens == loop_tokens
    assert torch.allclose(native_rows[-1], loop_rows[-1], rtol=0, atol=2e-3)


@needs_cpu
def test_a_row_never_depends_on_its_batch_mates(runner, loaded_model):
    prompts = [_prompt(loaded_model, text) for text in PROMPTS]
    alone, bufs = [], []
    for ids in prompts:
        buf = runner.new_buffer(64)
        runner.prefill(ids, buf)
        alone.append(runner.decode_batch([42], [buf])[0])
    for ids in prompts:
        buf = runner.new_buffer(64)
        runner.prefill(ids, buf)
        bufs.append(buf)
    for a, b in zip(alone, runner.decode_batch([42] * len(prompts), bufs)):
        assert torch.equal(a, b)


@needs_cpu
def test_the_thread_count_does_not_change_a_bit(runner, loaded_model, tmp_path):
    ids = (_prompt(loaded_model, " ".join(PROMPTS)) * 20)[:600]  # attention over three spans of keys
    buf = runner.new_buffer(len(ids) + 1)
    runner.prefill(ids, buf)
    here = runner.decode_batch([42], [buf])[0]
    assert torch.equal(one_thread_logits(ids, "float32", tmp_path), here)


@needs_cpu
def test_the_step_reads_the_prefills_tiles_and_holds_no_plain_copy(runner):
    held = {t.data_ptr() for t in runner.native.held}
    layer = runner.layers[0]
    assert {
        layer.wqkv.tiles.data_ptr(),
        layer.wdown.tiles.data_ptr(),
        runner.lm_head.tiles.data_ptr(),
    } <= held
    matmuls = [t for t in runner.native.held if t.dim() > 1]
    assert all(t.dim() == 3 and t.shape[2] == 16 for t in matmuls)  # packed [n / 16, k, 16], nothing else


@needs_cpu
def test_over_plain_weights_the_step_packs_its_own_tiles(loaded_model):
    plain = FusedLlamaRunner(loaded_model.model, native_linear=False)
    assert plain.native is not None and not plain.tiled
    ids = _prompt(loaded_model, PROMPTS[0])
    native_tokens, _ = _decode(plain, ids, 8, native=True)
    loop_tokens, _ = _decode(plain, ids, 8, native=False)
    assert native_tokens == loop_tokens


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the CPU lacks AVX-512: only the AVX2 width runs")
def test_the_avx512_and_avx2_widths_give_the_same_bits(runner, loaded_model, monkeypatch):
    ids = _prompt(loaded_model, PROMPTS[1])
    wide = _decode(runner, ids, 6, native=True)
    monkeypatch.setattr(native_decode, "wide_float32", lambda: False)
    geometry = (runner.heads, runner.kv_heads, runner.head_dim)
    narrow = NativeDecode.of(
        runner.layers, runner.final_norm, runner.lm_head, geometry, runner.eps, runner.scale
    )
    saved, runner.native = runner.native, narrow
    try:
        tokens, rows = _decode(runner, ids, 6, native=True)
    finally:
        runner.native = saved
    assert tokens == wide[0] and all(torch.equal(a, b) for a, b in zip(rows, wide[1]))


def test_the_engine_states_which_decode_step_runs():
    engine = Engine.from_config(EngineConfig(dtype="float32", check_exact_reuse=False))
    try:
        if HAS_CPU:  # never a silent fallback where the CPU has the instructions
            assert engine.stats()["decode"] == {"kernel": "native", "reason": None}
        else:
            assert engine.stats()["decode"]["reason"].startswith("the CPU lacks")
    finally:
        engine.close()
    reason = unavailable_reason(torch.float32, True, True)
    assert reason is None if HAS_CPU else str(reason).startswith("the CPU lacks")


@needs_cpu
def test_a_store_of_another_format_is_a_clear_error(runner):
    message = store_refusal(runner, torch.bfloat16)
    assert "a KV store must be [layers, 1, kv_heads, capacity > position, head_dim] float32" in message
