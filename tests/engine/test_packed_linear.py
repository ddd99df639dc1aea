"""Decode's prepacked weights give F.linear's bits, share one copy per weight, and fall back to the
plain weight where packing does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.packed_linear import PackedLinear, packing_supported


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
def test_packed_equals_linear_at_decode_rows(rows):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(960, 576, generator=gen).bfloat16()
    bias = torch.randn(960, generator=gen).bfloat16()
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    packed = PackedLinear.of(w)
    # packed where oneDNN has bfloat16 (else the plain weight, which must give the same bits trivially)
    assert (packed.packed is not None) == packing_supported(torch.bfloat16)
    assert torch.equal(packed(x), F.linear(x, w))
    # the bias after the product, as the runner adds it
    assert torch.equal(packed(x) + bias, F.linear(x, w) + bias)


def test_one_packed_copy_per_weight_and_float32_stays_plain():
    w = torch.randn(64, 32).bfloat16()
    assert PackedLinear.of(w).packed is PackedLinear.of(w).packed
    plain = PackedLinear.of(torch.randn(64, 32))
    assert plain.packed is None and plain.nbytes == 64 * 32 * 4  # the plain float32 weight
    x = torch.randn(2, 32)
    assert plain.plain is not None and torch.equal(plain(x), F.linear(x, plain.plain))
