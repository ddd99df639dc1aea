"""The native int8 kernels (engine/native/int8.py) against engine.quant's int8_linear on the real
model's int8 matrices: the same bits for every row at any row count, input dtype and thread count; a
runner on them gives engine.quant's prefill logits to the bit and its greedy decode; an engine with
int8 weights runs the native step wherever the CPU has AVX512-VNNI and AVX512-BF16 (never a silent
fallback), and says why not elsewhere."""

from __future__ import annotations

import pytest
import torch

from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native import int8 as native_int8
from engine.native.build import native_module
from engine.native.decode import INT8
from engine.native.int8 import Int8Tiled, int8_reason, int8_tiles, pack_int8_digits
from engine.quant.linear import int8_linear, quantize_weight
from tests.engine.reuse_helpers import assert_batched_equals_solo

HAS_INT8 = all(flag in cpu_flags() for flag in INT8.flags)
needs_int8 = pytest.mark.skipif(
    not HAS_INT8, reason="the CPU lacks AVX512-VNNI or AVX512-BF16: engine.quant runs (stated)"
)
ROWS = (1, 2, 3, 7, 16, 333)


@pytest.fixture(scope="module")
def model16():
    """The bundled model in bfloat16: the compute dtype the native int8 step runs its layers in."""
    return load_model("smollm2-135m-instruct", dtype="bfloat16")


@pytest.fixture(scope="module")
def quant_runner(model16):
    """engine.quant's kernels throughout: the reference."""
    return FusedLlamaRunner(
        model16.model,
        weights="int8",
        tokenizer=model16.tokenizer,
        native_linear=False,
        native_decode=False,
    )


@pytest.fixture(scope="module")
def native_runner(model16):
    runner = FusedLlamaRunner(model16.model, weights="int8", tokenizer=model16.tokenizer)
    assert runner.native is not None, runner.native_reason
    assert runner.tiled_int8 and runner.linear_kernel.startswith("native int8")
    return runner


def _rows(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    x[0, :3] = 0.0  # zeros and a tie-prone value per row
    x[:, 3] = 0.5
    return x.to(dtype)


@needs_int8
@pytest.mark.parametrize("name", ["wqkv", "wo", "wgu", "wdown", "lm_head"])
def test_the_same_bits_as_int8_linear_at_any_row_count(quant_runner, name):
    weight = quant_runner.lm_head if name == "lm_head" else getattr(quant_runner.layers[5], name)
    tiled = Int8Tiled.of(weight)
    for dtype in (torch.bfloat16, torch.float32):
        for i, rows in enumerate(ROWS if name != "lm_head" else (1, 5)):
            x = _rows(rows, weight.in_features, dtype, i)
            assert torch.equal(tiled(x), int8_linear(x, weight)), (name, dtype, rows)


@needs_int8
def test_a_row_does_not_depend_on_the_others_or_the_thread_count(quant_runner):
    weight = quant_runner.layers[0].wdown  # with its residual digit
    tiled = Int8Tiled.of(weight)
    x = _rows(40, weight.in_features, torch.bfloat16, 7)
    together = tiled(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([tiled(x[i : i + 1]) for i in range(40)])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, alone)


@needs_int8
def test_prefill_logits_are_engine_quants_bits_and_decode_answers_alike(
    native_runner, quant_runner, loaded_model
):
    ids = loaded_model.tokenizer("Q: Name the largest planet in the solar system.\nA:")["input_ids"]
    ours, ref = native_runner.new_buffer(len(ids) + 20), quant_runner.new_buffer(len(ids) + 20)
    a, b = native_runner.prefill(ids[:-3], ours), quant_runner.prefill(ids[:-3], ref)
    assert torch.equal(a, b)
    a, b = (
        native_runner.prefill(ids[-3:], ours),
        quant_runner.prefill(ids[-3:], ref),
    )  # a suffix on a cached prefix
    assert torch.equal(a, b)
    for mine, theirs in zip(ours.stores(), ref.stores()):  # the KV a cache would keep: the same bits
        assert torch.equal(mine[..., : len(ids), :], theirs[..., : len(ids), :])
    # decode: the native step sums attention in its own order, so close logits and the same greedy tokens
    for _ in range(12):
        token = int(b.argmax())
        assert int(a.argmax()) == token
        a, b = native_runner.decode_step(token, ours), quant_runner.decode_step(token, ref)
        assert (a - b).abs().max() < 2.0


@needs_int8
def test_batched_native_decode_equals_solo(native_runner):
    gen = torch.Generator().manual_seed(0)
    assert_batched_equals_solo(
        native_runner, [torch.randint(200, 40000, (n,), generator=gen).tolist() for n in (37, 5, 64)]
    )


def test_weights_without_onednn_digits_keep_engine_quants_kernels(monkeypatch):
    # fbgemm's packed weights keep no int8 matrix to tile (oneDNN narrowed below VNNI, or forced)
    monkeypatch.setattr(native_int8, "int8_backend", lambda: "fbgemm")
    assert "fbgemm" in str(int8_reason())


def test_where_the_kernels_cannot_run_the_runner_says_why(loaded_model):
    reason = int8_reason()
    assert (reason is None) == HAS_INT8
    # float32 layers: the native int8 Linears where they run, the layer loop for decode, and why
    runner = FusedLlamaRunner(loaded_model.model, weights="int8", tokenizer=loaded_model.tokenizer)
    assert runner.tiled_int8 == HAS_INT8 and runner.native is None
    why = "the native int8 step computes its layers in bfloat16" if HAS_INT8 else reason
    assert runner.decode_kernel == {"kernel": "layers", "reason": why}


def test_packing_rejects_shapes_it_cannot_tile():
    with pytest.raises(Exception, match="16n x 4k"):
        pack_int8_digits(torch.zeros(20, 8, dtype=torch.int8))
    with pytest.raises(Exception, match="16n x 4k"):
        pack_int8_digits(torch.zeros(16, 6, dtype=torch.int8))


@needs_int8
def test_bad_operands_are_clear_errors():
    parts = int8_tiles(quantize_weight(torch.randn(32, 64)))
    module = native_module()
    with pytest.raises(RuntimeError, match="int8 digits must be packed"):
        module.int8_linear_sums(torch.randn(2, 32).bfloat16(), parts)  # k does not match
    with pytest.raises(RuntimeError, match="bf16 or float32"):
        module.int8_linear_sums(torch.randn(2, 64).half(), parts)
    with pytest.raises(RuntimeError, match="4 tensors"):
        module.int8_linear_sums(torch.randn(2, 64), parts[:3])
