"""Block addresses: a hash chain that names the whole prefix, per model, formats and namespace."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.tiers.addresses import block_hashes, chain_root, model_fingerprint


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(cfg).eval()


def _fp(model, **overrides):
    args = {"model_id": "tiny", "dtype": "float32", "kv_dtype": "float32", "weights": "float32", **overrides}
    return model_fingerprint(model, **args)


def test_fingerprint_is_stable_and_names_everything_kv_depends_on():
    model = _tiny()
    base = _fp(model)
    assert base == _fp(_tiny())  # the same weights loaded again
    others = {
        _fp(model, model_id="other"),
        _fp(model, dtype="bfloat16"),
        _fp(model, kv_dtype="int8"),
        _fp(model, weights="int8"),
        _fp(model, kernels="native 0123abcd"),  # other kernels compute the KV: other bits
        _fp(_tiny(seed=1)),  # other weights
    }
    assert base not in others and len(others) == 6
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[0, 0] += 1.0  # a fine-tune touches every sampled weight
    assert _fp(model) != base
    model.config.rope_theta = 1234.0  # same weights, other positions: other keys
    assert _fp(_tiny()) != _fp(model)


def test_the_chain_names_the_whole_prefix():
    root = chain_root("f" * 64, "m\x1fa")
    tokens = list(range(200))
    keys = block_hashes(root, tokens)
    assert len(keys) == 3  # 200 tokens: three whole blocks, the last 8 tokens are not one
    assert block_hashes(root, tokens[:128]) == keys[:2]
    changed = [99] + tokens[1:]  # the first token differs: every later block's address differs
    assert not set(block_hashes(root, changed)) & set(keys)
    assert not set(block_hashes(chain_root("f" * 64, "m\x1fb"), tokens)) & set(keys)  # another tenant
    assert not set(block_hashes(chain_root("e" * 64, "m\x1fa"), tokens)) & set(keys)  # another model
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)
