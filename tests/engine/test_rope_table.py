"""RoPE cos/sin from the table are the rotary module's own bits, at any position and call size."""

from __future__ import annotations

import torch

from engine.rope_table import RopeTable


def test_table_equals_the_module_per_call(loaded_model):
    inner = loaded_model.model.model
    table = RopeTable(inner.rotary_emb, inner.embed_tokens.weight)
    for positions in (torch.tensor([0]), torch.arange(1500, 1517), torch.tensor([3, 700, 4095, 5000, 8191])):
        cos, sin = inner.rotary_emb(inner.embed_tokens.weight[:1], positions.unsqueeze(0))
        got_cos, got_sin = table(positions)
        assert got_cos.shape == (len(positions), 1, cos.shape[-1])
        assert torch.equal(got_cos[:, 0], cos[0]) and torch.equal(got_sin[:, 0], sin[0])


def test_bfloat16_table_is_in_the_model_dtype(loaded_model):
    inner = loaded_model.model.model
    like = inner.embed_tokens.weight.to(torch.bfloat16)
    cos, _ = RopeTable(inner.rotary_emb, like)(torch.arange(5))
    assert cos.dtype == torch.bfloat16
