"""The numerics that must hold on every code path, lean enough to run again under each narrower one
(marked ``numerics``: tests/engine/test_isa_paths.py runs them with torch, oneDNN and MKL limited):
reuse is as exact as the engine states in float32, bfloat16 and with int8 weights, for every KV
storage format; the int8 kernel's integer sums are exact; int8 answers as float32 does.

Where the path has no fast bfloat16 (AVX2 only: bfloat16 matmuls run a slow generic kernel there,
and ``dtype="auto"`` picks float32), bfloat16 runs on a two-layer model of the bundled model's widths
(random weights): the same matmul and attention shapes, fifteen times fewer layers.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.encoding import encode_prompt
from engine.exact_reuse import check_exact_reuse
from engine.fused import FusedLlamaRunner
from engine.isa import code_paths, has_fast_bfloat16
from engine.kv.codec import make_codec
from engine.models import load_model
from engine.quant.linear import backend_is_exact, int8_backend, int8_linear, quantize_weight
from tests.engine.reuse_helpers import assert_as_stated, real_text_ids

pytestmark = pytest.mark.numerics
PROMPT = 300


def _path_has_fast_bfloat16() -> bool:
    name = os.environ.get("PREFIXRAG_CODE_PATH", "native")
    path = next(p for p in code_paths() if p.name == name)
    return has_fast_bfloat16() and path.env.get("ONEDNN_MAX_CPU_ISA") != "AVX2"


def _two_layer_copy(loaded_model) -> LlamaForCausalLM:
    cfg = loaded_model.model.config
    torch.manual_seed(0)
    small = LlamaConfig(
        vocab_size=2048,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(small).eval().to(torch.bfloat16)


@pytest.fixture(scope="module")
def ids(loaded_model) -> list[int]:
    return [i % 2048 for i in real_text_ids(loaded_model.tokenizer, PROMPT)]


def _runner(kind: str, loaded_model):
    if kind == "float32":
        return FusedLlamaRunner(loaded_model.model)
    if kind == "int8":
        return FusedLlamaRunner(loaded_model.model, weights="int8", tokenizer=loaded_model.tokenizer)
    if _path_has_fast_bfloat16():
        return FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype="bfloat16").model)
    return FusedLlamaRunner(_two_layer_copy(loaded_model))


def _assert_reuse_as_stated(runner, ids: list[int]) -> None:
    cold = runner.new_buffer(len(ids))
    computed = runner.prefill(ids, cold)
    for cut in (len(ids) // 3, len(ids) - 1):  # a prefix off every tile size, and a one-token suffix
        earlier = runner.new_buffer(cut)
        runner.prefill(ids[:cut], earlier)
        warm = runner.new_buffer(len(ids))
        warm.load_prefix([earlier.segment(0, cut)])
        assert_as_stated(runner, runner.prefill(ids[cut:], warm), computed, f"cut at {cut}")
        if check_exact_reuse(runner).exact:
            a, b = warm.segment(0, len(ids)), cold.segment(0, len(ids))
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
def test_reuse_is_as_exact_as_stated(loaded_model, ids, kind):
    runner = _runner(kind, loaded_model)
    verdict = check_exact_reuse(runner)
    assert verdict.exact is not None and verdict.reason
    _assert_reuse_as_stated(runner, ids)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
def test_every_kv_format_reuses_as_stated(loaded_model, ids, kv_dtype):
    runner = FusedLlamaRunner(loaded_model.model, kv_codec=make_codec(kv_dtype, torch.float32))
    _assert_reuse_as_stated(runner, ids[:160])


def test_the_int8_kernel_sums_exactly_and_rows_stand_alone(loaded_model):
    backend = int8_backend()
    assert backend is not None and backend_is_exact(backend)
    weight = loaded_model.model.model.layers[0].mlp.down_proj.weight.detach()
    w = quantize_weight(weight, residual=True)
    x = torch.randn(70, weight.shape[1], generator=torch.Generator().manual_seed(3))
    full = int8_linear(x, w)
    assert torch.equal(int8_linear(x[17:20], w), full[17:20]) and torch.equal(int8_linear(x[:1], w), full[:1])


ANSWERS = {"What is the capital of France?": "Paris", "How many days are in a week?": "7"}


def test_int8_answers_as_float32_does(loaded_model):
    tok = loaded_model.tokenizer
    runners = {kind: _runner(kind, loaded_model) for kind in ("float32", "int8")}
    for question, word in ANSWERS.items():
        prompt = encode_prompt(tok, [{"role": "user", "content": question}], runners["float32"].vocab_size)
        answers = {kind: tok.decode(_greedy(runner, prompt, 10)) for kind, runner in runners.items()}
        assert all(word in text for text in answers.values()), (question, answers)


def _greedy(runner, prompt: list[int], tokens: int) -> list[int]:
    buffer = runner.new_buffer(len(prompt) + tokens)
    logits = runner.prefill(prompt, buffer)
    out = []
    for _ in range(tokens):
        out.append(int(logits.argmax()))
        logits = runner.decode_step(out[-1], buffer)
    return out
