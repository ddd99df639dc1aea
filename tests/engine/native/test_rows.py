"""A prefill's native row operations (engine/native/rows.py) against the torch operations they
replace: RoPE bit for bit, RMSNorm and SiLU * value within one bfloat16 step on rare elements (in
float32, within a few units in the last place), every row independent of the others; the bfloat16
runner uses them where the CPU has AVX512-BF16, the float32 one where it has AVX2 and FMA."""

from __future__ import annotations

import pytest
import torch

from engine.exact_reuse import kernel_signature
from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.decode import AVX2_FLAGS, NEEDED_FLAGS
from engine.native.rows import NativeRows, unavailable_reason_for

HAS_CPU = all(flag in cpu_flags() for flag in NEEDED_FLAGS)
needs_cpu = pytest.mark.skipif(not HAS_CPU, reason="the CPU lacks AVX512-BF16: the torch operations run")
HAS_AVX2 = all(flag in cpu_flags() for flag in AVX2_FLAGS)
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="the CPU lacks AVX2/FMA: float32's torch operations run")
EPS = 1e-5
# float32 RMSNorm and SiLU * value: the decode step's arithmetic, within a few units in the last place
F32_RELATIVE = 2e-6
DTYPES = [
    pytest.param(torch.bfloat16, marks=needs_cpu, id="bfloat16"),
    pytest.param(torch.float32, marks=needs_avx2, id="float32"),
]


@pytest.fixture(scope="module")
def rows() -> NativeRows:
    native = NativeRows.of(torch.bfloat16, EPS)
    assert native is not None
    return native


@pytest.fixture(scope="module")
def rows_f32() -> NativeRows:
    native = NativeRows.of(torch.float32, EPS)
    assert native is not None
    return native


def _torch_norm(x, weight):
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _torch_rope(qkv, cos, sin, heads, kv_heads, dim):
    x = qkv[:, : (heads + kv_heads) * dim].view(-1, heads + kv_heads, dim)
    half = dim // 2
    qk = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    return qk[:, :heads], qk[:, heads:]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 7, 300])
def test_rope_gives_torchs_bits(dtype, count):
    rows = NativeRows.of(dtype, EPS)
    assert rows is not None
    gen = torch.Generator().manual_seed(count)
    heads, kv_heads, dim = 9, 3, 64
    qkv = torch.randn(count, (heads + 2 * kv_heads) * dim, generator=gen).mul(4).to(dtype)
    angles = torch.rand(count, 1, dim, generator=gen) * 6.3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q, k = rows.rope(qkv, cos, sin, heads, kv_heads)
    want_q, want_k = _torch_rope(qkv, cos, sin, heads, kv_heads, dim)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


@needs_cpu
def test_norm_is_torchs_up_to_one_step_on_rare_elements(rows):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2000, 576, generator=gen) * torch.rand(2000, 1, generator=gen) * 8).bfloat16()
    weight = (torch.rand(576, generator=gen) + 0.5).bfloat16()
    assert (rows.norm(x, weight) != _torch_norm(x, weight)).float().mean() < 1e-3
    ones = torch.ones(576, dtype=torch.bfloat16)  # the normed value itself, before the weight rounds it
    got, want = rows.norm(x, ones).float(), _torch_norm(x, ones).float()
    differ = got != want
    assert differ.float().mean() < 1e-3
    step = want.abs() * 2.0**-7  # one bfloat16 step, or less
    assert bool(((got - want).abs() <= step)[differ].all())


@needs_cpu
def test_silu_mul_is_torchs_up_to_one_step_on_rare_elements(rows):
    gen = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(700, 2 * 1536, generator=gen) * 4).bfloat16()
    gate, value = gate_up.chunk(2, dim=-1)
    got, want = rows.silu_mul(gate_up).float(), (torch.nn.functional.silu(gate) * value).float()
    differ = got != want
    assert differ.float().mean() < 1e-3
    # the SiLU rounds once more in the product: within one step of SiLU times the value, plus the product's
    step = (torch.nn.functional.silu(gate.float()) * value.float()).abs() * 2.0**-6
    assert bool(((got - want).abs() <= step)[differ].all())


def _relative(got: torch.Tensor, want: torch.Tensor, floor: float) -> float:
    return float(((got - want).abs() / want.abs().clamp_min(floor)).max())


@needs_avx2
def test_float32_norm_and_silu_mul_are_torchs_to_a_few_ulps(rows_f32):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(500, 576, generator=gen) * torch.rand(500, 1, generator=gen) * 8
    weight = torch.rand(576, generator=gen) + 0.5
    assert _relative(rows_f32.norm(x, weight), _torch_norm(x, weight), 1e-6) < F32_RELATIVE
    gate_up = torch.randn(300, 2 * 1536, generator=gen) * 4
    gate, value = gate_up.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * value
    # near SiLU's zero crossing a relative bound means nothing: the floor is one ulp of the values
    assert _relative(rows_f32.silu_mul(gate_up), want, 1e-3) < F32_RELATIVE


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_is_the_same_alone_or_among_others(dtype):
    rows = NativeRows.of(dtype, EPS)
    assert rows is not None
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(200, 576, generator=gen).to(dtype)
    weight = torch.rand(576, generator=gen).to(dtype)
    together = rows.norm(x, weight)  # 200 rows: split across threads
    assert all(torch.equal(rows.norm(x[i : i + 1], weight)[0], together[i]) for i in (0, 117, 199))
    gate_up = torch.randn(64, 2 * 1536, generator=gen).to(dtype)
    products = rows.silu_mul(gate_up)
    assert all(torch.equal(rows.silu_mul(gate_up[i : i + 1])[0], products[i]) for i in (0, 31, 63))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_runner_uses_them(dtype):
    name = str(dtype).removeprefix("torch.")
    native = FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype=name).model)
    assert native.rows is not None and native.row_kernels.startswith("native ")
    plain = FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype=name).model, native_rows=False)
    assert plain.rows is None and plain.row_kernels == "torch"
    # their KV can differ in the last bits: the tiers' addresses keep them apart
    assert kernel_signature(native) != kernel_signature(plain)


def test_a_cpu_dtype_or_model_shape_without_them_gets_none():
    assert NativeRows.of(torch.float16, EPS) is None
    # a head dim the vectors cannot split: the torch operations run, not a failing kernel
    assert NativeRows.of(torch.float32, EPS, (576, 72, 1536)) is None
    assert NativeRows.of(torch.bfloat16, EPS, (576, 48, 1536)) is None
    assert (
        unavailable_reason_for(torch.float32, (580, 64, 1536)) == "the hidden size 580 is not a multiple of 8"
    )
    if not HAS_CPU:
        assert NativeRows.of(torch.bfloat16, EPS) is None
    if not HAS_AVX2:
        assert NativeRows.of(torch.float32, EPS) is None
