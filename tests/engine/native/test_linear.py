"""The native Linears (engine/native/linear.py): as close to exact products as oneDNN's bfloat16
kernel is, every row's bits independent of the rows beside it (so a prefill needs no row tiles), the
bias added as torch adds it, float32 logits, in both bfloat16 kernels (AVX512-BF16, and AVX2 + FMA
on every CPU); the bfloat16 runner uses them except on CPUs with AMX, prefills without padding where
the native attention runs too (its last layer computing the last row alone), and shares their packed
weights with the decode step; the residual add and SiLU * up in their epilogue give the separate
operations' bits.
float32: within a few float32 roundings of exact products, the same bits at AVX2 and AVX-512 width
and whatever rows share the call; the float32 runner uses them wherever AVX2 and FMA run."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from engine.fused import FusedLlamaRunner
from engine.fused_attention import PrefillAttention
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.build import NativeBuildError, build_key
from engine.native.decode import NEEDED_FLAGS
from engine.native.linear import (
    TiledLinear,
    available,
    pack_column_tiles,
    pack_float32_tiles,
    preferred,
    wide_bfloat16,
)
from engine.native.rows import NativeRows

HAS_CPU = all(flag in cpu_flags() for flag in NEEDED_FLAGS)
AMX = "amx_bf16" in cpu_flags()
WIDTHS = (False, True) if HAS_CPU else (False,)  # the bfloat16 kernels this CPU runs: AVX2, AVX512-BF16
# every CPU this project runs on has AVX2 and FMA (the float32 decode step needs them too): no skip
HAS_AVX512 = "avx512f" in cpu_flags()


def _weight(n: int = 960, k: int = 576, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).div(8).bfloat16()


def _rows(m: int, k: int = 576, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_packing_puts_each_columns_input_pairs_side_by_side():
    w = torch.arange(32 * 6, dtype=torch.float32).reshape(32, 6)
    tiles = pack_column_tiles(w)
    assert tiles.shape == (2, 3, 16, 2)
    for t, p, c in [(0, 0, 0), (1, 2, 15), (0, 1, 7)]:
        assert tiles[t, p, c].tolist() == w[16 * t + c, 2 * p : 2 * p + 2].tolist()
    with pytest.raises(NativeBuildError, match="16n x 2k"):
        pack_column_tiles(torch.zeros(40, 6))


@pytest.mark.parametrize("wide", WIDTHS)
def test_as_close_to_exact_products_as_onednns_bfloat16_kernel(wide):
    w, x = _weight(), _rows(300)
    exact = x.float() @ w.float().T
    linear = TiledLinear.of(w)
    kernel = linear._module.linear_tiles
    native = kernel(x, linear.tiles, x.new_empty(0), False, wide).float()
    onednn = F.linear(x, w).float()
    assert (native - exact).abs().max() <= 1.01 * (onednn - exact).abs().max() + 1e-6
    # the float32 sums are the exact products of these bf16 inputs, up to float32 summation
    assert torch.allclose(kernel(x, linear.tiles, x.new_empty(0), True, wide), exact, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wide", WIDTHS)
@pytest.mark.parametrize("n", [960, 3072, 576])
def test_a_rows_bits_never_depend_on_the_rows_beside_it(n, wide):
    k = 1536 if n == 576 else 576
    linear, x = TiledLinear.of(_weight(n, k)), _rows(70, k)
    kernel, none = linear._module.linear_tiles, x.new_empty(0)

    def rounded(rows):
        return kernel(rows, linear.tiles, none, False, wide)

    def sums(rows):
        return kernel(rows, linear.tiles, none, True, wide)

    whole, whole_sums = rounded(x), sums(x)
    for cuts in [(1,), (3, 4), (5, 6, 11, 25), (8, 9, 17, 25), (16, 32, 48, 64)]:
        edges = [0, *cuts, len(x)]
        assert torch.equal(torch.cat([rounded(x[a:b]) for a, b in itertools.pairwise(edges)]), whole), cuts
        assert torch.equal(torch.cat([sums(x[a:b]) for a, b in itertools.pairwise(edges)]), whole_sums)
    assert torch.equal(rounded(x[5:6]), whole[5:6])  # one row alone, as a warm prefill computes it


def test_outputs_round_the_sums_and_add_the_bias_as_torch_does():
    w, x = _weight(), _rows(20)
    bias = torch.randn(960).bfloat16()
    linear = TiledLinear.of(w)
    sums = linear.sums(x)
    assert sums.dtype == torch.float32
    assert torch.equal(linear(x), sums.bfloat16())
    assert torch.equal(linear(x, bias), linear(x) + bias)


def test_the_residual_add_and_silu_gate_give_the_separate_operations_bits():
    linear, x = TiledLinear.of(_weight(960, 576)), _rows(37)
    residual, bias = torch.randn(37, 960).bfloat16(), torch.randn(960).bfloat16()
    for b in (None, bias):
        # in the AVX512-BF16 kernel's epilogue where it runs, else torch's add: the same bits
        assert torch.equal(linear(x, b, residual=residual), residual + linear(x, b))
    rows = NativeRows.of(torch.bfloat16, 1e-5) if HAS_CPU else None
    silu_mul = rows.silu_mul if rows is not None else _torch_silu_mul
    gate_up = TiledLinear.of(_weight(2 * 1536, 576))
    for m in (1, 8, 37):
        assert torch.equal(gate_up.glu(x[:m], silu_mul), silu_mul(gate_up(x[:m])))


def _torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, value = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * value


@pytest.mark.skipif(not HAS_CPU, reason="the epilogues are the AVX512-BF16 kernel's; AVX2 adds in torch")
def test_the_epilogues_refuse_bad_operands_with_a_clear_error():
    linear, x = TiledLinear.of(_weight()), _rows(4)
    with pytest.raises(RuntimeError, match="residual must be contiguous"):
        linear._module.linear_tiles_add(x, linear.tiles, x.new_empty(0), torch.zeros(4, 17).bfloat16())
    odd = TiledLinear.of(_weight(48, 576))
    with pytest.raises(RuntimeError, match="as many up as gate"):
        odd._module.linear_tiles_glu(x, odd.tiles)


def test_bad_inputs_are_a_clear_error():
    linear = TiledLinear.of(_weight())
    with pytest.raises(RuntimeError, match="column tiles"):
        linear(_rows(2, 512))
    with pytest.raises(RuntimeError, match="bias"):
        linear(_rows(2), torch.zeros(17).bfloat16())
    with pytest.raises(NativeBuildError, match="bfloat16 or float32"):
        TiledLinear.of(torch.zeros(32, 8, dtype=torch.float16))


def test_a_runner_prefers_them_except_where_the_cpu_has_amx():
    runner = FusedLlamaRunner(load_model(dtype="bfloat16").model)
    amx = "amx_bf16" in cpu_flags()
    assert preferred(torch.bfloat16) is not amx and preferred(torch.float32)
    assert runner.linear_kernel == ("onednn" if amx else f"native {build_key()}")
    assert runner.rows_exact is not amx  # the native attention and Linears: no row is padded


def _prefilled_whole_and_split_alike(runner: FusedLlamaRunner, tokenizer) -> tuple[list[int], torch.Tensor]:
    """A prompt prefilled whole and in four calls: the same float32 logits and every layer's K/V bits."""
    ids = tokenizer("The capital of France is Paris. The capital of Italy is")["input_ids"]
    whole = runner.new_buffer(len(ids) + 1)
    logits = runner.prefill(ids, whole)
    split = runner.new_buffer(len(ids) + 1)
    for a, b in [(0, 1), (1, 5), (5, len(ids) - 1), (len(ids) - 1, len(ids))]:
        last = runner.prefill(ids[a:b], split)
    assert torch.equal(last, logits) and logits.dtype == torch.float32
    n = len(ids)
    for a, b in zip(whole.stores(), split.stores()):
        assert torch.equal(a[:, :, :, :n], b[:, :, :, :n])
    return ids, logits


def test_the_runner_prefills_unpadded_rows_exactly_and_shares_the_packed_weights():
    loaded = load_model(dtype="bfloat16")
    runner = FusedLlamaRunner(loaded.model, native_linear=True, native_attention=True)
    assert runner.rows_exact and runner.tiled
    # the decode step reads the prefill's tiles: the weights are held once
    held = {t.data_ptr() for t in runner.native.held}
    assert runner.layers[0].wqkv.tiles.data_ptr() in held and runner.lm_head.tiles.data_ptr() in held
    ids, logits = _prefilled_whole_and_split_alike(runner, loaded.tokenizer)
    plain = FusedLlamaRunner(loaded.model, native_linear=False)
    reference = plain.prefill(ids, plain.new_buffer(len(ids) + 1))
    assert int(logits.argmax()) == int(reference.argmax())
    assert F.cosine_similarity(logits, reference, dim=0) > 0.999


def test_a_prefills_last_layer_computes_every_rows_kv_and_the_last_row_alone():
    loaded = load_model(dtype="bfloat16")
    runner = FusedLlamaRunner(loaded.model, native_linear=True, native_attention=True)
    ids = loaded.tokenizer("Row-exact kernels: the last layer's other rows feed nothing.")["input_ids"]
    pruned = runner.new_buffer(len(ids) + 1)
    logits = runner.prefill(ids, pruned)
    # the same prompt through every layer whole, every row's output computed
    full = runner.new_buffer(len(ids) + 1)
    full.ensure_storage(runner.kv_heads, runner.head_dim, runner.dtype, runner.device)
    attention = PrefillAttention(full, 0, len(ids), None, runner.scale, runner.attention)
    x = runner.run_layers(runner.embed_ids(ids), torch.arange(len(ids)), attention)
    full.set_length(len(ids))
    assert torch.equal(logits, runner.last_logits(x))
    for a, b in zip(pruned.stores(), full.stores()):
        assert torch.equal(a[:, :, :, : len(ids)], b[:, :, :, : len(ids)])


def test_runners_over_one_model_share_one_packed_copy():
    model = load_model(dtype="bfloat16").model
    first, second = (FusedLlamaRunner(model, native_linear=True) for _ in range(2))
    assert first.layers[3].wgu.tiles is second.layers[3].wgu.tiles
    assert first.lm_head.tiles is second.lm_head.tiles


def test_a_process_narrowed_to_avx2_multiplies_bfloat16_on_avx2(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # this process narrowed to a CPU without AVX-512
    assert available(torch.bfloat16) and not wide_bfloat16()
    runner = FusedLlamaRunner(load_model(dtype="bfloat16").model, native_linear=True)
    # the native Linears and the native attention (the float32 kernel over bfloat16): no row padded
    assert runner.tiled and not runner.lm_head._wide and runner.rows_exact


def test_the_process_narrowed_below_avx2_keeps_torchs_tiles(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert not available(torch.float32) and not available(torch.bfloat16)
    runner = FusedLlamaRunner(load_model(dtype="float32").model, native_linear=True)
    assert not runner.tiled and runner.linear_kernel == "torch"
    runner = FusedLlamaRunner(load_model(dtype="bfloat16").model, native_linear=True)
    assert not runner.tiled and runner.linear_kernel in ("onednn", "torch") and not runner.rows_exact


# ---- float32 ---------------------------------------------------------------------------------


def _weight32(n: int = 960, k: int = 576, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).div(k**0.5)


def _rows32(m: int, k: int = 576, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


def test_float32_packing_puts_each_inputs_columns_side_by_side():
    w = torch.arange(32 * 6, dtype=torch.float32).reshape(32, 6)
    tiles = pack_float32_tiles(w)
    assert tiles.shape == (2, 6, 16)
    for t, p, c in [(0, 0, 0), (1, 5, 15), (0, 3, 7)]:
        assert tiles[t, p, c].item() == w[16 * t + c, p].item()
    with pytest.raises(NativeBuildError, match="16n rows"):
        pack_float32_tiles(torch.zeros(40, 6))


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (49152, 64)])
def test_float32_products_are_within_a_few_roundings_of_exact_ones(n, k):
    w, x = _weight32(n, k), _rows32(37, k)
    exact = x.double() @ w.double().T
    native = TiledLinear.of(w)(x).double()
    # one fused multiply-add per input: each adds at most half an ulp of the running sum
    bound = k * 2**-24 * (x.double().abs() @ w.double().abs().T)
    assert ((native - exact).abs() <= bound).all()
    torch_error = (F.linear(x, w).double() - exact).abs().max()
    assert (native - exact).abs().max() < 8 * torch_error  # the same order as torch's own


@pytest.mark.parametrize("n", [960, 3072, 576])
def test_float32_rows_bits_never_depend_on_the_rows_beside_it_or_the_width(n):
    k = 1536 if n == 576 else 576
    linear, x = TiledLinear.of(_weight32(n, k)), _rows32(70, k)
    bias = torch.randn(n)
    whole = linear(x, bias)
    for cuts in [(1,), (3, 4), (6, 7, 13, 25), (8, 16, 32, 48, 64)]:
        edges = [0, *cuts, len(x)]
        parts = [linear(x[a:b], bias) for a, b in itertools.pairwise(edges)]
        assert torch.equal(torch.cat(parts), whole), cuts
    assert torch.equal(linear(x[5:6], bias), whole[5:6])
    kernel = linear._module.linear_tiles_f32
    narrow = kernel(x, linear.tiles, bias, False)  # the AVX2 kernel
    assert torch.equal(narrow, whole)
    if HAS_AVX512:
        assert torch.equal(kernel(x, linear.tiles, bias, True), whole)
    assert torch.equal(whole, linear(x) + bias) and torch.equal(linear.sums(x), linear(x))


def test_float32_bad_inputs_are_a_clear_error():
    linear = TiledLinear.of(_weight32())
    with pytest.raises(RuntimeError, match="column tiles"):
        linear(_rows32(2, 512))
    with pytest.raises(RuntimeError, match="bias"):
        linear(_rows32(2), torch.zeros(17))
    with pytest.raises(RuntimeError, match="float32"):
        linear(_rows32(2).double())


def test_the_float32_runner_prefills_rows_exactly():
    loaded = load_model(dtype="float32")
    runner = FusedLlamaRunner(loaded.model)  # its decode step reads these tiles (test_decode_f32.py)
    assert runner.tiled and runner.linear_kernel == f"native {build_key()}"
    ids, logits = _prefilled_whole_and_split_alike(runner, loaded.tokenizer)
    plain = FusedLlamaRunner(loaded.model, native_linear=False)
    reference = plain.prefill(ids, plain.new_buffer(len(ids) + 1))
    assert int(logits.argmax()) == int(reference.argmax())
    assert F.cosine_similarity(logits, reference, dim=0) > 0.99999
