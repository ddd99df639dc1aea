"""A reused chunk's keys rotated in place by the native call (engine/native/key_rotation.py): the
torch form's bits (engine.chunks.stitch.rotate_keys, then the store's dtype) for every key of a
strided run of a KV store, nothing outside the run touched; bad operands refused by name."""

from __future__ import annotations

import pytest
import torch

from engine.chunks.stitch import rotate_keys
from engine.isa import cpu_flags
from engine.native.decode import AVX2_FLAGS
from engine.native.key_rotation import Rotate, native_rotation

HAS_CPU = all(flag in cpu_flags() for flag in AVX2_FLAGS)
pytestmark = pytest.mark.skipif(not HAS_CPU, reason="the CPU lacks AVX2 and FMA: the torch form runs")


@pytest.fixture(scope="module")
def rotate() -> Rotate:
    native = native_rotation()
    assert native is not None
    return native


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)


def _angles(dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    angle = (torch.rand(dim // 2, generator=g) * 400).repeat(2)  # RoPE's halves share their angles
    return torch.cos(angle), torch.sin(angle)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dim", [64, 128])
def test_native_rotation_gives_the_torch_forms_bits_in_place(
    rotate: Rotate, dtype: torch.dtype, dim: int
) -> None:
    g = torch.Generator().manual_seed(dim)
    store = (torch.randn(4, 1, 3, 300, dim, generator=g) * 5).to(dtype)  # [layers, 1, kv_heads, cap, D]
    before = store.clone()
    keys = store[:, 0, :, 37:241]  # a run: strided over layers and heads
    cos, sin = _angles(dim, seed=dim + 1)
    want = rotate_keys(keys, cos, sin).to(dtype)
    rotate(keys, cos, sin)
    assert torch.equal(_bits(store[:, 0, :, 37:241]), _bits(want))
    assert torch.equal(store[:, :, :, :37], before[:, :, :, :37])
    assert torch.equal(store[:, :, :, 241:], before[:, :, :, 241:])


def test_native_rotation_of_one_key_equals_the_key_in_a_long_run(rotate: Rotate) -> None:
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(30, 3, 2048, 64, generator=g).to(torch.bfloat16)  # split across threads
    alone = keys[:, :, 1500:1501].clone()
    cos, sin = _angles(64, seed=4)
    rotate(keys, cos, sin)
    rotate(alone, cos, sin)
    assert torch.equal(_bits(keys[:, :, 1500:1501]), _bits(alone))


@pytest.mark.parametrize(
    ("keys", "cos", "message"),
    [
        (torch.zeros(2, 3, 4, 64, dtype=torch.float16), torch.ones(64), "bfloat16 or float32"),
        (torch.zeros(2, 3, 64, 4).transpose(2, 3), torch.ones(64), "contiguous rows"),
        (torch.zeros(3, 4, 64), torch.ones(64), "layers, kv_heads, tokens, head_dim"),
        (torch.zeros(2, 3, 4, 64), torch.ones(32), "cos/sin"),
        (torch.zeros(2, 3, 4, 64), torch.ones(64, dtype=torch.float64), "cos/sin"),
        (torch.zeros(2, 3, 4, 24), torch.ones(24), "multiple of 16"),
    ],
)
def test_native_rotation_refuses_bad_operands_by_name(
    rotate: Rotate, keys: torch.Tensor, cos: torch.Tensor, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message):
        rotate(keys, cos, cos)
