"""The AMX Linear (engine/native/linear_amx.cpp): on CPUs with AMX, every row at any row count gets the
bits of oneDNN's AMX bfloat16 Linear in a 16-row call, with the bias and a residual added as torch
adds them; a oneDNN-packed Linear sends its calls of up to AMX_ROWS rows there (engine.packed_linear) sharing the decode step's column tiles; and a
runner over both still reuses cached KV exactly. On a CPU without AMX, the kernel says so and nothing
sends it a call."""

from __future__ import annotations

import pytest
import torch

from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.build import native_module
from engine.native.linear import TiledLinear, amx_available, amx_fits
from engine.packed_linear import AMX_ROWS, PackedLinear, packing_supported
from engine.row_tiles import BASE_MENU

AMX = "amx_bf16" in cpu_flags()
needs_amx = pytest.mark.skipif(not AMX, reason="this CPU has no AMX-BF16: the AMX Linear never runs here")

# [n, k]: a fused QKV, the MLP's down projection (k = 1,536), and 5 column tiles (one group of 4 and a
# single tile)
SHAPES = ((960, 576), (576, 1536), (80, 576))


def weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) / k**0.5).bfloat16()


def rows(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@needs_amx
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_onednns_bits_at_any_row_count(shape):
    w = weight(*shape)
    tiled, packed = TiledLinear.of(w), PackedLinear(w, torch.ops.mkldnn._reorder_linear_weight(w, 1))
    assert packed.amx is None  # oneDNN alone: the reference
    x = rows(300, shape[1])
    with torch.inference_mode():
        for m in (16, 17, 31, 64, 100, 300):
            assert torch.equal(tiled.amx(x[:m]), packed(x[:m])), m
        # each row alone, or in any company, gets the bits of its 16-row oneDNN tile
        tile = packed.tiled(x[:16], BASE_MENU)
        for m in (1, 3, 15):
            assert torch.equal(tiled.amx(x[:m]), tile[:m]), m
        assert torch.equal(tiled.amx(x[5:6]), packed.tiled(x[5:21], BASE_MENU)[:1])


@needs_amx
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_row_gets_its_16_row_tiles_bits_at_a_few_hundred_rows(shape):
    # oneDNN itself blocks some of these counts' sums another way (256 rows over 1,536 inputs on one
    # Xeon): its 16-row tiles are the reference
    w = weight(*shape)
    tiled, packed = TiledLinear.of(w), PackedLinear(w, torch.ops.mkldnn._reorder_linear_weight(w, 1))
    x = rows(AMX_ROWS + 16, shape[1])
    with torch.inference_mode():
        base = packed.tiled(x, BASE_MENU)
        for m in (256, AMX_ROWS, AMX_ROWS + 16):
            assert torch.equal(tiled.amx(x[:m]), base[:m]), m


@needs_amx
def test_bias_and_residual_as_torchs_adds():
    w = weight(960, 576)
    tiled = TiledLinear.of(w)
    x, residual = rows(40, 576), rows(40, 960, seed=2)
    bias = torch.randn(960, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.inference_mode():
        plain = tiled.amx(x)
        assert torch.equal(tiled.amx(x, bias), plain + bias)
        assert torch.equal(tiled.amx(x, bias, residual), residual + (plain + bias))


@needs_amx
def test_packed_linear_sends_small_calls_to_amx_on_the_decode_steps_tiles():
    w = weight(960, 576)
    packed = PackedLinear.of(w)
    assert packed.amx is not None and packed.amx.tiles is TiledLinear.of(w).tiles  # one copy
    x = rows(2 * AMX_ROWS, 576)
    with torch.inference_mode():
        alone = PackedLinear(w, packed.packed)  # the same packed weight, oneDNN only
        for m in (1, AMX_ROWS, AMX_ROWS + 16):
            assert torch.equal(
                packed.tiled(x[: max(m, 16)], BASE_MENU), alone.tiled(x[: max(m, 16)], BASE_MENU)
            )


@needs_amx
def test_packed_linear_adds_bias_and_residual_as_torch_on_either_kernel():
    w = weight(960, 576)
    packed = PackedLinear.of(w)
    bias = torch.randn(960, generator=torch.Generator().manual_seed(3)).bfloat16()
    x, residual = rows(AMX_ROWS + 16, 576), rows(AMX_ROWS + 16, 960, seed=2)
    with torch.inference_mode():
        for m in (20, AMX_ROWS + 16):  # the AMX kernel's epilogue, then oneDNN and torch's adds
            assert torch.equal(packed(x[:m], bias, residual[:m]), residual[:m] + (packed(x[:m]) + bias)), m
            tiled = packed.tiled(x[:m], BASE_MENU, bias, residual[:m])
            assert torch.equal(tiled, residual[:m] + (packed.tiled(x[:m], BASE_MENU) + bias)), m


def test_the_kernel_states_where_it_runs():
    assert amx_available() == (AMX and bool(native_module().amx_ready()))
    assert not amx_fits(weight(960, 560))  # k not a multiple of 32
    assert not amx_fits(weight(960, 576).float())
    if not AMX:
        assert PackedLinear.of(weight(960, 576)).amx is None
        with pytest.raises(RuntimeError, match="AMX"):
            TiledLinear.of(weight(960, 576)).amx(rows(4, 576))


@needs_amx
@pytest.mark.skipif(not packing_supported(torch.bfloat16), reason="needs oneDNN's bfloat16 packing")
def test_runner_reuses_cached_kv_exactly_with_amx_calls():
    model = load_model(dtype="bfloat16").model
    runner = FusedLlamaRunner(model)
    assert runner.packed and all(layer.wqkv.amx is not None for layer in runner.layers)
    ids = torch.randint(100, 40000, (600,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        whole = runner.new_buffer(600)
        full = runner.prefill(ids, whole)
        split = runner.new_buffer(600)
        # whole: oneDNN's 512-row tile, then AMX; split: AMX calls of 300, 290, 9 and 1 rows
        for start, end in ((0, 300), (300, 590), (590, 599), (599, 600)):
            last = runner.prefill(ids[start:end], split)
    assert torch.equal(last, full)
    k_whole, v_whole = whole.stores()
    k_split, v_split = split.stores()
    assert torch.equal(k_whole[:, :, :, :600], k_split[:, :, :, :600])
    assert torch.equal(v_whole[:, :, :, :600], v_split[:, :, :, :600])
