"""engine.quant.linear: int8 weights times per-row int8 activations, on the real model's weights."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.quant.linear import backend_order, int8_linear, pack_int8, quantize_rows, quantize_weight

pytestmark = pytest.mark.numerics  # also run under each narrower code path (test_isa_paths)


@pytest.fixture(scope="module")
def real_weights(loaded_model):
    """Layer 0's fused q/k/v rows and its down projection, as the runner quantizes them."""
    layer = loaded_model.model.model.layers[0]
    a = layer.self_attn
    qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
    return {"qkv": qkv, "down": layer.mlp.down_proj.weight.detach()}


@pytest.fixture(scope="module")
def activations(loaded_model):
    """Real hidden states: 67 token embeddings of the model, RMS-normalised like the runner's input."""
    ids = torch.arange(1000, 1067)
    x = F.embedding(ids, loaded_model.model.model.embed_tokens.weight).detach()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


@pytest.mark.parametrize("rows", [(0, 1), (5, 6), (3, 20), (17, 67), (0, 67), (40, 43)])
def test_a_row_does_not_depend_on_the_other_rows(real_weights, activations, rows):
    w = quantize_weight(real_weights["qkv"])
    full = int8_linear(activations, w)
    start, end = rows
    assert torch.equal(int8_linear(activations[start:end], w), full[start:end])


ONE_THREAD = """
import sys
import numpy as np
import torch
from engine.quant.linear import int8_linear, quantize_weight
torch.set_num_threads(1)
weight, x = (torch.from_numpy(np.load(p)) for p in sys.argv[1:3])
np.save(sys.argv[3], int8_linear(x, quantize_weight(weight)).numpy())
"""


def test_rows_in_another_order_and_thread_count_give_the_same_bits(real_weights, activations, tmp_path):
    w = quantize_weight(real_weights["qkv"])
    full = int8_linear(activations, w)
    order = torch.randperm(activations.shape[0], generator=torch.Generator().manual_seed(0))
    assert torch.equal(int8_linear(activations[order], w), full[order])
    # one thread in a process of its own: torch.set_num_threads changes MKL's threading mode for the
    # whole process, which would leave the other numerics tests on another code path
    paths = [tmp_path / f"{name}.npy" for name in ("weight", "x", "out")]
    np.save(paths[0], real_weights["qkv"].numpy())
    np.save(paths[1], activations.numpy())
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", ONE_THREAD, *map(str, paths)], check=True, env=env, timeout=300)
    assert torch.equal(torch.from_numpy(np.load(paths[2])), full)


@pytest.mark.parametrize("name", ["qkv", "down"])
def test_close_to_the_float_matmul(real_weights, name):
    weight = real_weights[name]
    x = torch.randn(32, weight.shape[1], generator=torch.Generator().manual_seed(1))
    exact = F.linear(x, weight)
    approx = int8_linear(x, quantize_weight(weight))
    assert ((approx - exact).norm() / exact.norm()).item() < 0.03


def test_weights_round_to_127_levels_per_output_row(real_weights):
    weight = real_weights["down"]
    q, scales = quantize_rows(weight)
    assert q.dtype == torch.int8 and scales.dtype == torch.float32
    assert q.abs().amax(dim=1).eq(127).all()  # each row's largest weight sets its scale
    assert (q.float() * scales[:, None] - weight).abs().le(scales[:, None] / 2 + 1e-7).all()


def test_zero_rows_and_bias_and_leading_dims(real_weights):
    weight = real_weights["qkv"]
    w = quantize_weight(weight)
    x = torch.zeros(2, 3, weight.shape[1])
    bias = torch.arange(weight.shape[0], dtype=torch.float32)
    out = int8_linear(x, w, bias)
    assert out.shape == (2, 3, weight.shape[0])
    assert torch.equal(out, bias.expand(2, 3, -1))  # an all-zero row (padding) stays exactly zero


def test_pack_rejects_what_it_cannot_pack():
    with pytest.raises(ValueError, match="int8"):
        pack_int8(torch.zeros(4, 8), torch.ones(4))
    with pytest.raises(ValueError, match="scales"):
        pack_int8(torch.zeros(4, 8, dtype=torch.int8), torch.ones(3))


def test_onednn_first_only_where_the_cpu_has_int8_dot_products(monkeypatch):
    # without VNNI or AMX oneDNN's int8 matmul saturates or runs a slow reference kernel
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert backend_order(frozenset({"avx2", "fma"})) == ("fbgemm", "onednn")
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert backend_order(frozenset({"avx2", flag})) == ("onednn", "fbgemm")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # narrowed below the dot products
    assert backend_order(frozenset({"avx2", "avx512_vnni"})) == ("fbgemm", "onednn")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert backend_order(frozenset({"avx512_vnni", "amx_int8"})) == ("onednn", "fbgemm")
