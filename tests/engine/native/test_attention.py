"""A prefill's native attention (engine/native/attention.py), in bfloat16 and float32: as close to
exact attention as torch's kernel in that dtype is, every row's bits independent of the split, its
batch mates and the thread count, keys past the last row never read, in each kernel the CPU runs
(bfloat16: AMX's, AVX512-BF16's, and the float32 kernel over widened bfloat16 on every CPU); a
runner uses it in either dtype (every CPU this project runs on has AVX2 and FMA: no skip), and a
prompt's answer matches the one torch's kernel gives."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.attention import NativeAttention
from engine.native.build import build_key
from engine.native.decode import NEEDED_FLAGS

HAS_WIDE = all(flag in cpu_flags() for flag in NEEDED_FLAGS)
needs_wide = pytest.mark.skipif(
    not HAS_WIDE, reason="the CPU lacks AVX512-BF16: the AVX2 kernel is the bfloat16 one"
)
AMX = "amx_bf16" in cpu_flags()
needs_amx = pytest.mark.skipif(not AMX, reason="the CPU lacks AMX-BF16: no AMX kernel to run")
HEADS, KV_HEADS, DIM, SCALE = 9, 3, 64, 0.125

# (dtype, the process narrowed to AVX2 while the kernel is chosen, AMX's kernel where it runs)
KERNELS = [
    pytest.param((torch.bfloat16, False, True), id="bfloat16"),
    pytest.param((torch.bfloat16, False, False), marks=[needs_amx, needs_wide], id="bfloat16-avx512"),
    pytest.param((torch.bfloat16, True, True), marks=needs_wide, id="bfloat16-avx2"),
    pytest.param((torch.float32, False, True), id="float32"),
]
BFLOAT16 = [KERNELS[0], KERNELS[1], KERNELS[2]]


def _kernel(dtype: torch.dtype, narrowed: bool, amx: bool = True) -> NativeAttention:
    with pytest.MonkeyPatch.context() as patch:
        if narrowed:
            patch.setenv("ATEN_CPU_CAPABILITY", "avx2")
        native = NativeAttention.of(dtype, DIM, amx=amx)
    assert native is not None
    return native


@pytest.fixture(scope="module", params=KERNELS)
def attention(request) -> NativeAttention:
    return _kernel(*request.param)


def _inputs(
    tokens: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HEADS, DIM, generator=gen).mul(2).to(dtype)
    capacity = tokens + 40
    k = torch.randn(KV_HEADS, capacity, DIM, generator=gen).mul(2).to(dtype)
    v = torch.randn(KV_HEADS, capacity, DIM, generator=gen).to(dtype)
    k[:, tokens:] = float("nan")  # past the last row: never read
    v[:, tokens:] = float("nan")
    return q, k, v


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = q.shape[0]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None].to(dtype),
        k[None, :, :t].to(dtype),
        v[None, :, :t].to(dtype),
        is_causal=True,
        scale=SCALE,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).reshape(t, -1).float()


@pytest.mark.parametrize("kernel", BFLOAT16)
def test_as_close_to_exact_attention_as_torchs_bfloat16_kernel(kernel):
    attention = _kernel(*kernel)
    q, k, v = _inputs(700)
    exact = _sdpa(q, k, v, torch.float32)
    native = attention(q, k, v, torch.arange(700), SCALE).float()
    torch_bf16 = _sdpa(q, k, v, torch.bfloat16)
    assert torch.isfinite(native).all()
    native_err, torch_err = (native - exact).abs(), (torch_bf16 - exact).abs()
    assert native_err.mean() <= 1.5 * torch_err.mean()
    assert native_err.max() <= 2 * torch_err.max()


def test_float32_is_as_close_to_exact_attention_as_torchs_float32_kernel():
    attention = NativeAttention.of(torch.float32, DIM)
    assert attention is not None
    q, k, v = _inputs(700, dtype=torch.float32)
    exact = _sdpa(q.double(), k.double(), v.double(), torch.float64)
    native = attention(q, k, v, torch.arange(700), SCALE).double()
    torch_f32 = _sdpa(q, k, v, torch.float32).double()
    assert torch.isfinite(native).all()
    native_err, torch_err = (native - exact).abs(), (torch_f32 - exact).abs()
    assert native_err.mean() <= 2 * torch_err.mean()
    assert native_err.max() <= 4 * torch_err.max()


@pytest.mark.parametrize("cuts", [(1,), (37, 520), (16, 32, 529), (529,)])
def test_a_prompt_split_anywhere_gives_every_row_the_same_bits(attention, cuts):
    q, k, v = _inputs(530, dtype=attention.dtype)
    positions = torch.arange(530)
    whole = attention(q, k, v, positions, SCALE)
    bounds = [0, *cuts, 530]
    parts = [attention(q[a:b], k, v, positions[a:b], SCALE) for a, b in itertools.pairwise(bounds)]
    assert torch.equal(torch.cat(parts), whole)


def test_rows_at_explicit_positions_equal_each_row_alone(attention):
    q, k, v = _inputs(400, seed=1, dtype=attention.dtype)
    positions = torch.tensor([3, 17, 18, 64, 250, 251, 399])  # a stitched prefill's recomputed rows
    rows = attention(q[: len(positions)], k, v, positions, SCALE)
    for i, p in enumerate(positions.tolist()):
        alone = attention(q[i : i + 1], k, v, torch.tensor([p]), SCALE)
        assert torch.equal(alone, rows[i : i + 1])
    exact = _sdpa(q[:1].expand(400, -1, -1).contiguous(), k, v, torch.float32)[399]
    assert torch.allclose(attention(q[:1], k, v, torch.tensor([399]), SCALE)[0].float(), exact, atol=0.02)


@pytest.mark.parametrize(
    "amx", [pytest.param(True, id="amx-where-present"), pytest.param(False, id="no-amx")]
)
@pytest.mark.parametrize(
    "heads,kv_heads,dim", [(9, 3, 64), (4, 4, 128), (16, 1, 64), (8, 2, 128), (14, 7, 64)]
)
def test_any_group_geometry_gives_each_row_its_bits_alone(heads, kv_heads, dim, amx):
    # rows of a key/value group's heads share passes over its keys: in tiles of several positions, or
    # one head at a time for a few rows; either way a row's bits are its own
    native = NativeAttention.of(torch.bfloat16, dim, amx=amx)
    assert native is not None
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(150, heads, dim, generator=gen).bfloat16()
    k, v = (torch.randn(kv_heads, 160, dim, generator=gen).bfloat16() for _ in range(2))
    whole = native(q, k, v, torch.arange(150), SCALE)
    for i in (0, 63, 64, 149):
        assert torch.equal(native(q[i : i + 1], k, v, torch.tensor([i]), SCALE), whole[i : i + 1])
    few = native(q[140:], k, v, torch.arange(140, 150), SCALE)
    assert torch.equal(few, whole[140:])
    exact = _sdpa_geometry(q.float(), k.float(), v.float())
    assert (whole.float() - exact).abs().max() < 0.05


def _sdpa_geometry(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t = q.shape[0]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[None, :, :t], v[None, :, :t], is_causal=True, scale=SCALE, enable_gqa=True
    )
    return out[0].transpose(0, 1).reshape(t, -1)


def test_the_thread_count_never_changes_a_result(attention):
    q, k, v = _inputs(300, seed=2, dtype=attention.dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attention(q, k, v, torch.arange(300), SCALE)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, attention(q, k, v, torch.arange(300), SCALE))


def test_bad_positions_are_a_clear_error(attention):
    q, k, v = _inputs(8, dtype=attention.dtype)
    with pytest.raises(RuntimeError, match="ascending"):
        attention(q[:2], k, v, torch.tensor([5, 4]), SCALE)
    with pytest.raises(RuntimeError, match="capacity"):
        attention(q[:1], k, v, torch.tensor([k.shape[1]]), SCALE)


def test_runs_only_for_bfloat16_and_float32_at_the_head_dims_it_is_compiled_for():
    assert NativeAttention.of(torch.float16, DIM) is None
    assert NativeAttention.of(torch.bfloat16, 96) is None and NativeAttention.of(torch.float32, 96) is None


def test_a_runner_prefers_it_and_the_kernel_names_itself():
    runner = FusedLlamaRunner(load_model(dtype="bfloat16").model)
    kernel = "amx" if AMX else "avx512-bf16" if HAS_WIDE else "float32"
    assert runner.attention_kernel == f"native {kernel} {build_key()}"
    assert runner.rows_exact is not AMX  # AMX: oneDNN's Linears in row tiles; else the native ones


@needs_amx
def test_amx_and_avx512_kernels_agree_closely_and_are_told_apart():
    # their sums run in different orders, so a runner holds one and its kernel signature names it
    q, k, v = _inputs(300, seed=4)
    amx, wide = _kernel(torch.bfloat16, False, True), _kernel(torch.bfloat16, False, False)
    assert (amx.name, wide.name) == ("amx", "avx512-bf16")
    a, w = (kernel(q, k, v, torch.arange(300), SCALE).float() for kernel in (amx, wide))
    assert (a - w).abs().max() < 0.02


def test_the_bfloat16_runner_answers_as_with_torchs_kernel():
    loaded = load_model(dtype="bfloat16")
    native = FusedLlamaRunner(loaded.model, native_attention=True)
    plain = FusedLlamaRunner(loaded.model, native_attention=False)
    assert native.attention_kernel.startswith("native ") and plain.attention_kernel == "torch"
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    text = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = loaded.tokenizer(text)["input_ids"]
    last = []
    for runner in (native, plain):
        last.append(runner.prefill(ids, runner.new_buffer(len(ids) + 8)))
    assert int(last[0].argmax()) == int(last[1].argmax())
    assert F.cosine_similarity(last[0], last[1], dim=0) > 0.999


def test_the_float32_runner_prefers_it_and_answers_as_with_torchs_kernel():
    loaded = load_model(dtype="float32")
    native = FusedLlamaRunner(loaded.model)
    plain = FusedLlamaRunner(loaded.model, native_attention=False)
    assert native.attention_kernel == f"native float32 {build_key()}" and plain.attention_kernel == "torch"
    assert native.rows_exact and not plain.rows_exact  # with the native Linears: no row is padded
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    text = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = loaded.tokenizer(text)["input_ids"]
    last = [runner.prefill(ids, runner.new_buffer(len(ids) + 8)) for runner in (native, plain)]
    assert int(last[0].argmax()) == int(last[1].argmax())
    assert F.cosine_similarity(last[0], last[1], dim=0) > 0.99999
