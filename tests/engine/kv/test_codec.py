"""KV storage formats: bytes per token, exact round trips, and rounding that never drifts."""

import pytest
import torch

from engine.kv.codec import KV_DTYPES, KVGeometry, make_codec

SMOLLM2 = KVGeometry(layers=30, kv_heads=3, head_dim=64)
COMPUTE = [torch.float32, torch.bfloat16]


def _samples(dtype: torch.dtype) -> list[torch.Tensor]:
    """Head vectors at every scale, zeros, a lone huge value, and subnormal-sized values."""
    gen = torch.Generator().manual_seed(0)
    out = [torch.randn(4, 3, 16, 64, generator=gen) * s for s in (1e-30, 1e-6, 1e-2, 1.0, 37.0, 1e4)]
    mixed = torch.randn(2, 3, 8, 64, generator=gen)
    mixed[0, 0, 0] = 0.0
    mixed[0, 1, 1, :7] = 1e-38
    mixed[1, 2, 3, 5] = 3e3
    out.append(mixed)
    return [x.to(dtype) for x in out]


def test_bytes_per_token_of_the_bundled_model(loaded_model):
    geometry = KVGeometry.from_config(loaded_model.model.config)
    assert geometry == SMOLLM2
    got = {name: make_codec(name, torch.float32).bytes_per_token(geometry) for name in KV_DTYPES}
    assert got == {"float32": 46_080, "bfloat16": 23_040, "float16": 23_040, "int8": 11_880}
    assert got["int8"] <= 12_000  # 30 layers x 3 heads x (64 codes + 2-byte scale) x K and V


@pytest.mark.parametrize("compute", COMPUTE, ids=str)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_round_trip_is_exact_and_rounding_idempotent(kv_dtype, compute):
    codec = make_codec(kv_dtype, compute)
    for x in _samples(compute):
        stored = codec.encode(x)
        rounded = codec.round(x)
        assert stored.dtype == codec.stored_dtype
        assert rounded.dtype == compute
        assert torch.equal(codec.decode(stored), rounded)  # what the cache loads == what attention used
        assert torch.equal(codec.encode(rounded), stored)  # storing a loaded prefix again changes nothing
        assert torch.equal(codec.round(rounded), rounded)


@pytest.mark.parametrize("compute", COMPUTE, ids=str)
def test_int8_error_is_bounded_by_half_a_step(compute):
    codec = make_codec("int8", compute)
    x = torch.randn(8, 3, 32, 64).to(compute)
    err = (codec.round(x).float() - x.float()).abs()
    step = x.float().abs().amax(-1, keepdim=True) / 127
    # bfloat16 models use power-of-two scales (up to 2x the step); float32 ones a bfloat16 scale
    slack = 2.0 if compute == torch.bfloat16 else 1.0 + 2**-8
    assert bool((err <= step * slack / 2 + 1e-30).all())
    assert err.max() > 0  # it really is quantized


def test_int8_packs_codes_and_scale_and_decodes_into_a_strided_view():
    codec = make_codec("int8", torch.float32)
    x = torch.randn(2, 3, 5, 64)
    stored = codec.encode(x)
    assert stored.shape == (2, 3, 5, 66) and stored.dtype == torch.int8
    assert (
        int(stored[..., :64].abs().amax()) == 127
    )  # the largest value of each head vector uses the full range
    buffer = torch.zeros(2, 1, 3, 9, 64)
    codec.decode_into(buffer[:, 0, :, 2:7], stored)
    assert torch.equal(buffer[:, 0, :, 2:7], codec.round(x))
    assert not buffer[:, 0, :, :2].any() and not buffer[:, 0, :, 7:].any()


def test_float32_on_a_bfloat16_model_is_the_model_precision():
    codec = make_codec("float32", torch.bfloat16)
    assert codec.identity and codec.stored_dtype == torch.bfloat16
    assert codec.bytes_per_token(SMOLLM2) == 23_040


def test_unknown_kv_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unsupported kv_dtype 'int4'.*int8"):
        make_codec("int4", torch.float32)


@pytest.mark.parametrize("name", ["engine.kv.codec", "engine.tiers.addresses"])
def test_docstring_examples(name):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(name)).failed == 0
