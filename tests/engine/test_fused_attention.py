"""engine.fused_attention: the prefill's masks, converted once per forward, give SDPA's own bits."""

from __future__ import annotations

import pytest
import torch

from engine.fused_attention import additive_mask, attend
from engine.prefill_shapes import prefill_mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "past", "keys"), [(16, 0, 512), (512, 512, 1536), (64, 700, 1024)])
def test_an_additive_mask_attends_bit_for_bit_as_the_bool_mask(dtype, rows, past, keys):
    gen = torch.Generator().manual_seed(rows + past)
    q = torch.randn(rows, 9, 64, generator=gen).to(dtype)
    k = torch.randn(1, 3, keys, 64, generator=gen).to(dtype)
    v = torch.randn(1, 3, keys, 64, generator=gen).to(dtype)
    visible = prefill_mask(rows, past, keys)
    mask = additive_mask(visible, dtype)
    assert mask.dtype == dtype and torch.equal(mask == 0, visible)
    assert torch.equal(attend(q, k, v, past, 0.125, visible), attend(q, k, v, past, 0.125, mask))
