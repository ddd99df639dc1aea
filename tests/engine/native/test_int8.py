"""The native int8 kernels (engine/native/int8.py) against engine.quant's int8_linear on the real
model's int8 matrices: the same bits for every row at any row count, input dtype and thread count, in
the kernel of either backend's levels (AVX512-VNNI at oneDNN's 127, AVX2 at fbgemm's 63, worst-case
digits included); a runner on them gives engine.quant's prefill logits to the bit and its greedy
decode, in each compute dtype whose native int8 step runs here (never a silent fallback), and says
why not elsewhere."""

from __future__ import annotations

import pytest
import torch

from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.build import native_module
from engine.native.decode import INT8, INT8_F32, unavailable_reason
from engine.native.int8 import Int8Tiled, int8_reason, int8_tiles, pack_int8_digits
from engine.quant.linear import int8_linear, pack_for, quantize_rows, quantize_weight
from tests.engine.reuse_helpers import assert_batched_equals_solo

KERNELS = int8_reason() is None
needs_kernels = pytest.mark.skipif(not KERNELS, reason=f"{int8_reason()}: engine.quant runs (stated)")
HAS_AVX2 = INT8_F32.unavailable_reason() is None
needs_avx2 = pytest.mark.skipif(
    not HAS_AVX2, reason=f"{INT8_F32.unavailable_reason()}: engine.quant runs (stated)"
)
HAS_VNNI = all(flag in cpu_flags() for flag in INT8.flags)
# the compute dtypes whose native int8 step runs here: bfloat16 layers (VNNI), float32 layers (AVX2)
STEP_DTYPES = [
    name for name in ("bfloat16", "float32") if unavailable_reason(getattr(torch, name), False, True) is None
]
ROWS = (1, 2, 3, 7, 16, 333)


@pytest.fixture(scope="module", params=STEP_DTYPES)
def step_model(request, loaded_model):
    """The bundled model in a compute dtype whose native int8 step runs here."""
    return (
        loaded_model
        if request.param == "float32"
        else load_model("smollm2-135m-instruct", dtype=request.param)
    )


@pytest.fixture(scope="module")
def quant_runner(step_model):
    """engine.quant's kernels throughout: the reference."""
    return FusedLlamaRunner(
        step_model.model,
        weights="int8",
        tokenizer=step_model.tokenizer,
        native_linear=False,
        native_decode=False,
    )


@pytest.fixture(scope="module")
def native_runner(step_model):
    runner = FusedLlamaRunner(step_model.model, weights="int8", tokenizer=step_model.tokenizer)
    assert runner.native is not None, runner.native_reason
    assert runner.tiled_int8 and runner.linear_kernel.startswith("native int8")
    return runner


@pytest.fixture(scope="module")
def reference_weights(loaded_model):
    """The real model's int8 matrices, packed for this machine's backend."""
    runner = FusedLlamaRunner(
        loaded_model.model,
        weights="int8",
        tokenizer=loaded_model.tokenizer,
        native_linear=False,
        native_decode=False,
    )
    return {
        **{name: getattr(runner.layers[5], name) for name in ("wqkv", "wo", "wgu", "wdown")},
        "lm_head": runner.lm_head,
    }


def _rows(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    x[0, :3] = 0.0  # zeros and a tie-prone value per row
    x[:, 3] = 0.5
    return x.to(dtype)


def _assert_int8_linear_bits(weight, row_counts) -> None:
    tiled = Int8Tiled.of(weight)
    for dtype in (torch.bfloat16, torch.float32):
        for i, rows in enumerate(row_counts):
            x = _rows(rows, weight.in_features, dtype, i)
            assert torch.equal(tiled(x), int8_linear(x, weight)), (dtype, rows)


@needs_kernels
@pytest.mark.parametrize("name", ["wqkv", "wo", "wgu", "wdown", "lm_head"])
def test_the_same_bits_as_int8_linear_at_any_row_count(reference_weights, name):
    _assert_int8_linear_bits(reference_weights[name], ROWS if name != "lm_head" else (1, 5))


@needs_avx2
@pytest.mark.parametrize("residual", [False, True])
def test_fbgemm_levels_run_the_avx2_kernel_to_the_bit(reference_weights, residual):
    # fbgemm's 63 levels on any CPU with AVX2 (an AVX-512 one too): the real down projection's digits
    # and worst cases, every weight +-127 against rows whose digits are all +-63
    name = "wdown" if residual else "wgu"
    weight = reference_weights[name]
    q, scales = quantize_rows(torch.randn(weight.out_features, weight.in_features), residual)
    for digits in (q, torch.full_like(q, 127), torch.full_like(q, -127)):
        fbgemm = pack_for("fbgemm", digits, scales)
        _assert_int8_linear_bits(fbgemm, (1, 2, 5))
        tiled = Int8Tiled.of(fbgemm)
        for sign in (1.0, -1.0):
            x = torch.full((3, weight.in_features), sign)
            assert torch.equal(tiled(x), int8_linear(x, fbgemm)), sign


@needs_kernels
def test_a_row_does_not_depend_on_the_others_or_the_thread_count(reference_weights):
    tiled = Int8Tiled.of(reference_weights["wdown"])  # with its residual digit
    x = _rows(40, tiled.in_features, torch.bfloat16, 7)
    together = tiled(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([tiled(x[i : i + 1]) for i in range(40)])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, alone)


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


def test_batched_native_decode_equals_solo(native_runner):
    gen = torch.Generator().manual_seed(0)
    assert_batched_equals_solo(
        native_runner, [torch.randint(200, 40000, (n,), generator=gen).tolist() for n in (37, 5, 64)]
    )


def test_where_the_kernels_cannot_run_the_runner_says_why(loaded_model):
    # float32 layers: the native int8 Linears and step where they run, else the layer loop, and why
    runner = FusedLlamaRunner(loaded_model.model, weights="int8", tokenizer=loaded_model.tokenizer)
    assert runner.tiled_int8 == KERNELS
    why = unavailable_reason(torch.float32, False, True)
    assert (runner.native is None) == (why is not None)
    expected = {"kernel": "layers", "reason": why} if why else {"kernel": "native", "reason": None}
    assert runner.decode_kernel == expected
    # bfloat16 layers around int8: the VNNI step only
    assert (unavailable_reason(torch.bfloat16, False, True) is None) == (HAS_VNNI and int8_reason() is None)


def test_packing_rejects_shapes_it_cannot_tile():
    with pytest.raises(Exception, match="16n x 4k"):
        pack_int8_digits(torch.zeros(20, 8, dtype=torch.int8))
    with pytest.raises(Exception, match="16n x 4k"):
        pack_int8_digits(torch.zeros(16, 6, dtype=torch.int8))


@needs_kernels
def test_bad_operands_are_clear_errors():
    parts = int8_tiles(quantize_weight(torch.randn(32, 64)))
    module = native_module()
    with pytest.raises(RuntimeError, match="int8 digits must be packed"):
        module.int8_linear_sums(torch.randn(2, 32).bfloat16(), parts)  # k does not match
    with pytest.raises(RuntimeError, match="bf16 or float32"):
        module.int8_linear_sums(torch.randn(2, 64).half(), parts)
    with pytest.raises(RuntimeError, match="4 tensors"):
        module.int8_linear_sums(torch.randn(2, 64), parts[:3])
    with pytest.raises(RuntimeError, match="63 activation levels"):
        module.int8_linear_sums(torch.randn(2, 64), [*parts[:3], torch.tensor([100.0])])
