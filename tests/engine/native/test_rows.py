"""A prefill's native row operations (engine/native/rows.py) against the torch operations they
replace: RoPE bit for bit, RMSNorm and SiLU * value within one bfloat16 step on rare elements, every
row independent of the others; the bfloat16 runner uses them where the CPU has AVX512-BF16, the float32 one never."""

from __future__ import annotations

import pytest
import torch

from engine.exact_reuse import kernel_signature
from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.decode import NEEDED_FLAGS
from engine.native.rows import NativeRows

HAS_CPU = all(flag in cpu_flags() for flag in NEEDED_FLAGS)
needs_cpu = pytest.mark.skipif(not HAS_CPU, reason="the CPU lacks AVX512-BF16: the torch operations run")
EPS = 1e-5


@pytest.fixture(scope="module")
def rows() -> NativeRows:
    native = NativeRows.of(torch.bfloat16, EPS)
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


@needs_cpu
@pytest.mark.parametrize("count", [1, 7, 300])
def test_rope_gives_torchs_bits(rows, count):
    gen = torch.Generator().manual_seed(count)
    heads, kv_heads, dim = 9, 3, 64
    qkv = torch.randn(count, (heads + 2 * kv_heads) * dim, generator=gen).mul(4).bfloat16()
    angles = torch.rand(count, 1, dim, generator=gen) * 6.3
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
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


@needs_cpu
def test_each_row_is_the_same_alone_or_among_others(rows):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 576, generator=gen).bfloat16()
    weight = torch.rand(576, generator=gen).bfloat16()
    together = rows.norm(x, weight)
    assert all(torch.equal(rows.norm(x[i : i + 1], weight)[0], together[i]) for i in (0, 17, 63))
    gate_up = torch.randn(64, 2 * 1536, generator=gen).bfloat16()
    products = rows.silu_mul(gate_up)  # 64 rows: split across threads
    assert all(torch.equal(rows.silu_mul(gate_up[i : i + 1])[0], products[i]) for i in (0, 31, 63))


@needs_cpu
def test_the_bfloat16_runner_uses_them_and_the_float32_runner_does_not():
    bf16 = FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype="bfloat16").model)
    assert bf16.rows is not None and bf16.row_kernels.startswith("native ")
    assert FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype="float32").model).rows is None
    plain = FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype="bfloat16").model, native_rows=False)
    assert plain.rows is None and plain.row_kernels == "torch"
    # their KV can differ in rare bits: the tiers' addresses keep them apart
    assert kernel_signature(bf16) != kernel_signature(plain)


def test_a_cpu_or_dtype_without_them_gets_none():
    assert NativeRows.of(torch.float32, EPS) is None
    if not HAS_CPU:
        assert NativeRows.of(torch.bfloat16, EPS) is None
