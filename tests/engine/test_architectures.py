"""Prefix reuse is exact on more than one architecture, and refused where it would be wrong."""

import logging

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from engine import Engine, EngineConfig, SamplingParams
from engine.fused import FusedLlamaRunner
from engine.runner import ModelRunner
from prefix_cache import RadixCache
from tests.engine.reuse_helpers import assert_as_stated

VOCAB = 512


def _tiny_qwen2():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        use_sliding_window=False,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _tiny_llama_with_biases():
    """Llama with ``attention_bias=True``: q/k/v *and* o_proj carry a bias (made non-zero here)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attention_bias=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, proj).bias.normal_(std=0.5)
    return model


def _tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512)
    return GPT2LMHeadModel(cfg).eval()


class _IdTokenizer:
    """Token ids rendered as words: enough for engines fed with id prompts."""

    eos_token_id = None
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [int(w) % VOCAB for w in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" {i}" for i in ids)


def _reuse_logits(runner, prompt, prefix_len):
    """Logits of the last prompt position: full prefill vs cached prefix (through a RadixCache) + suffix."""
    cache = RadixCache(capacity_bytes=1 << 30)
    first = runner.new_buffer(len(prompt))
    runner.prefill(prompt[:prefix_len] + [1], first)
    cache.insert(prompt[:prefix_len] + [1], first.segment(0, prefix_len + 1))
    match = cache.match_prefix(prompt, max_length=len(prompt) - 1)
    warm = runner.new_buffer(len(prompt))
    warm.load_prefix(match.values)
    reused = runner.prefill(prompt[match.length :], warm)
    cold = runner.prefill(prompt, runner.new_buffer(len(prompt)))
    return match.length, reused, cold


@pytest.mark.parametrize(
    "build",
    [_tiny_qwen2, _tiny_llama_with_biases, _tiny_gpt2],
    ids=["qwen2-fused", "llama-biases-fused", "gpt2-hf"],
)
@pytest.mark.parametrize("prefix_len", [0, 37, 98])
def test_tiny_models_reuse_exactly(build, prefix_len):
    model = build()
    fused = model.config.model_type in ("qwen2", "llama")
    runner = FusedLlamaRunner(model) if fused else ModelRunner(model)
    prompt = [(i * 7 + 3) % VOCAB for i in range(100)]
    matched, reused, cold = _reuse_logits(runner, prompt, prefix_len)
    assert matched == min(prefix_len, 99)
    assert torch.equal(reused, cold)


def test_fused_runner_applies_o_proj_bias():
    model = _tiny_llama_with_biases()
    runner = FusedLlamaRunner(model)
    prompt = [(i * 13 + 1) % VOCAB for i in range(40)]
    buffer = runner.new_buffer(len(prompt) + 1)
    fused = runner.prefill(prompt, buffer)
    with torch.inference_mode():
        reference = model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(fused, reference[-1], atol=1e-4, rtol=0)
    step = runner.decode_step(7, buffer)
    with torch.inference_mode():
        reference = model(torch.tensor([[*prompt, 7]])).logits[0, -1]
    torch.testing.assert_close(step, reference, atol=1e-4, rtol=0)


def test_bundled_model_logits_agree(loaded_model):
    runner = FusedLlamaRunner(loaded_model.model)
    prompt = loaded_model.tokenizer.encode("Prefix caching reuses attention state. " * 20)
    for prefix_len in (5, len(prompt) // 2, len(prompt) - 2):
        matched, reused, cold = _reuse_logits(runner, prompt, prefix_len)
        assert matched == prefix_len
        assert_as_stated(runner, reused, cold, f"prefix {prefix_len}")


def test_fused_runner_matches_transformers(loaded_model):
    prompt = loaded_model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)
    fused = FusedLlamaRunner(loaded_model.model)
    hf = ModelRunner(loaded_model.model)
    a = fused.prefill(prompt, fused.new_buffer(len(prompt) + 4))
    b = hf.prefill(prompt, hf.new_buffer(len(prompt) + 4))
    torch.testing.assert_close(a, b, atol=1e-3, rtol=0)


@pytest.mark.parametrize("build", [_tiny_qwen2, _tiny_gpt2], ids=["qwen2-fused", "gpt2-hf"])
def test_tiny_engine_greedy_equal_with_and_without_cache(build):
    model = build()
    tok = _IdTokenizer()
    cached = Engine(model, tok, model_id="tiny", config=EngineConfig(model="tiny"))
    plain = Engine(model, tok, model_id="tiny", config=EngineConfig(model="tiny", enable_prefix_cache=False))
    try:
        base = [(i * 11 + 5) % VOCAB for i in range(80)]
        params = SamplingParams(max_tokens=12)
        cached.generate(base, params)
        for tail in ([1, 2, 3], [], [9] * 20):
            prompt = base + tail
            a, b = cached.generate(prompt, params), plain.generate(prompt, params)
            assert a.token_ids == b.token_ids
            assert a.cached_tokens >= min(len(base), len(prompt) - 1)
            assert b.cached_tokens == 0
    finally:
        cached.close()
        plain.close()


def test_sliding_window_model_turns_caching_off(caplog):
    torch.manual_seed(0)
    cfg = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=16,
        max_position_embeddings=512,
    )
    model = MistralForCausalLM(cfg).eval()
    with caplog.at_level(logging.WARNING, logger="engine.engine"):
        eng = Engine(model, _IdTokenizer(), model_id="mistral-sw")
    try:
        assert not eng.caching
        assert "sliding-window" in caplog.text
        prompt = list(range(1, 60))
        eng.generate(prompt, SamplingParams(max_tokens=4))
        assert eng.generate(prompt, SamplingParams(max_tokens=4)).cached_tokens == 0
        assert type(eng.runner).__name__ == "ModelRunner"  # sliding windows need transformers' masks
    finally:
        eng.close()
