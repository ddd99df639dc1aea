"""The native decode step (engine/native/decode.py) against the Python layer loop on the real model:
close logits, the same greedy answers, and rows that never depend on their batch mates or on the
thread count, in each bfloat16 step this CPU runs (AVX512-BF16's, and AVX2 + FMA's on every CPU). The
bfloat16 engine must run one (never a silent fallback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model
from engine.native.decode import AVX2_FLAGS, NEEDED_FLAGS, step_for, unavailable_reason
from engine.native.int8 import int8_reason

HAS_CPU = all(flag in cpu_flags() for flag in AVX2_FLAGS)  # a bfloat16 step runs: AVX2 + FMA at least
needs_cpu = pytest.mark.skipif(not HAS_CPU, reason="the CPU lacks AVX2/FMA: the layer loop runs (stated)")
HAS_WIDE = all(flag in cpu_flags() for flag in NEEDED_FLAGS)  # the AVX512-BF16 step and row passes
HAS_INT8 = HAS_WIDE and "avx512_vnni" in cpu_flags()  # the int8 step (tests/engine/native/test_int8.py)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "List three primary colors:",
]
# closeness to float32 is a sum of rounding noise: enough positions that one near-tie does not decide it
CLOSENESS_PROMPTS = PROMPTS + [
    "Once upon a time, in a small village,",
    "The quick brown fox",
    "Explain photosynthesis in one sentence.",
    "import numpy as np\n",
    "Q: What is 12 times 7?\nA:",
]
CLOSENESS_STEPS = 24
NEAR_TIE = 0.25  # logits this close are a tie under bfloat16's rounding noise (2 steps of 0.125 near 25)


@pytest.fixture(scope="module")
def runner():
    fused = FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype="bfloat16").model)
    assert fused.native is not None, fused.native_reason
    return fused


def _prompt(loaded_model, text):
    return loaded_model.tokenizer(text)["input_ids"]


def _decode(runner, ids, steps, native):
    saved = runner.native
    runner.native = saved if native else None
    try:
        buf = runner.new_buffer(len(ids) + steps + 1)
        logits = runner.prefill(ids, buf)
        tokens, rows = [], []
        for _ in range(steps):
            token = int(logits.argmax())
            tokens.append(token)
            logits = runner.decode_step(token, buf)
            rows.append(logits)
        return tokens, rows
    finally:
        runner.native = saved


def _kl(rows, reference):
    p, q = torch.stack(rows).log_softmax(-1), torch.stack(reference).log_softmax(-1)
    return float(torch.nn.functional.kl_div(p, q, log_target=True, reduction="batchmean"))


@needs_cpu
def test_greedy_tokens_and_distributions_as_close_to_float32_as_the_layer_loop(runner, loaded_model):
    reference = FusedLlamaRunner(loaded_model.model, native_decode=False)  # float32, the layer loop
    agree = {"native": 0, "loop": 0}
    kl: dict[str, list[float]] = {"native": [], "loop": []}
    for text in CLOSENESS_PROMPTS:
        ids = _prompt(loaded_model, text)
        tokens, float_rows = _decode(reference, ids, CLOSENESS_STEPS, native=False)  # its own greedy answer
        for kind in agree:  # both bfloat16 steps fed float32's greedy answer, token by token
            rows = _forced_bf16(runner, ids, tokens, native=kind == "native")
            agree[kind] += sum(int(row.argmax()) == int(want.argmax()) for row, want in zip(rows, float_rows))
            kl[kind].append(_kl(rows, float_rows))
    # both round to bfloat16 at the same steps, with float32 sums in other orders (attention's, and the
    # Linears' too where those are oneDNN's): neither is the closer one by design (a near-tie of two tokens may fall either way), so the native step must be
    # about as close to float32 as the loop is, in greedy choices and in distributions
    assert agree["native"] >= agree["loop"] - 1, agree
    assert agree["native"] >= 0.9 * CLOSENESS_STEPS * len(CLOSENESS_PROMPTS), agree
    assert sum(kl["native"]) <= 1.5 * sum(kl["loop"]), kl


def _forced(runner, ids, tokens):
    buf = runner.new_buffer(len(ids) + len(tokens) + 1)
    runner.prefill(ids, buf)
    return [runner.decode_step(token, buf) for token in tokens]


def _forced_bf16(runner, ids, tokens, native):
    saved = runner.native
    runner.native = saved if native else None
    try:
        return _forced(runner, ids, tokens)
    finally:
        runner.native = saved


@needs_cpu
def test_a_row_never_depends_on_its_batch_mates(runner, loaded_model):
    prompts = [_prompt(loaded_model, text) for text in PROMPTS]
    alone = []
    for ids in prompts:
        buf = runner.new_buffer(64)
        runner.prefill(ids, buf)
        alone.append(runner.decode_batch([42], [buf])[0])
    bufs = []
    for ids in prompts:
        buf = runner.new_buffer(64)
        runner.prefill(ids, buf)
        bufs.append(buf)
    batched = runner.decode_batch([42] * len(prompts), bufs)
    for a, b in zip(alone, batched):
        assert torch.equal(a, b)


ONE_THREAD = """
import sys
import numpy as np
import torch
from engine.fused import FusedLlamaRunner
from engine.models import load_model
torch.set_num_threads(1)
runner = FusedLlamaRunner(load_model("smollm2-135m-instruct", dtype=sys.argv[3]).model)
assert runner.native is not None, runner.native_reason
ids = [int(i) for i in sys.argv[1].split(",")]
buf = runner.new_buffer(len(ids) + 1)
runner.prefill(ids, buf)
np.save(sys.argv[2], runner.decode_batch([42], [buf])[0].numpy())
"""


def one_thread_logits(ids: list[int], dtype: str, tmp_path: Path) -> torch.Tensor:
    """The logits of token 42 after ``ids``, decoded natively on one thread in a process of its own:
    torch.set_num_threads changes MKL's threading mode for the whole process (engine.isa.mkl_dynamic),
    which would move the other numerics tests."""
    out = tmp_path / "one_thread.npy"
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", ONE_THREAD, ",".join(map(str, ids)), str(out), dtype]
    subprocess.run(command, check=True, env=env, timeout=300)
    assert torch.get_num_threads() > 1 or os.cpu_count() == 1
    return torch.from_numpy(np.load(out))


@needs_cpu
def test_the_thread_count_does_not_change_a_bit(runner, loaded_model, tmp_path):
    ids = _prompt(loaded_model, PROMPTS[0])
    buf = runner.new_buffer(len(ids) + 1)
    runner.prefill(ids, buf)
    here = runner.decode_batch([42], [buf])[0]
    assert torch.equal(one_thread_logits(ids, "bfloat16", tmp_path), here)


@needs_cpu
def test_long_context_attention_matches_the_layer_loop(runner, loaded_model):
    ids = (_prompt(loaded_model, " ".join(PROMPTS)) * 60)[:1500]  # attention over 1,500 keys
    native_tokens, native_rows = _decode(runner, ids, 4, native=True)
    loop_tokens, loop_rows = _decode(runner, ids, 4, native=False)
    assert native_tokens == loop_tokens
    assert torch.nn.functional.cosine_similarity(native_rows[-1], loop_rows[-1], dim=0) > 0.999


def test_the_engine_states_which_decode_step_runs():
    engine = Engine.from_config(EngineConfig(dtype="bfloat16", check_exact_reuse=False))
    try:
        if HAS_CPU:  # on this CPU the native step (and with AVX512-BF16 the row passes) must run
            assert engine.stats()["decode"] == {"kernel": "native", "reason": None}
            assert engine.stats()["prefill_rows"].startswith("native ") is HAS_WIDE
        else:
            assert engine.stats()["decode"]["reason"].startswith("the CPU lacks")
            assert engine.stats()["prefill_rows"] == "torch"
    finally:
        engine.close()
    engine = Engine.from_config(EngineConfig(dtype="bfloat16", native_decode=False, check_exact_reuse=False))
    try:
        assert engine.stats()["decode"] == {"kernel": "layers", "reason": "native_decode=False"}
    finally:
        engine.close()


def test_unsupported_settings_say_why():
    assert "float16" in str(unavailable_reason(torch.float16, True, True))
    # int8 around float32 layers: wherever the int8 kernels run (tests/engine/native/test_int8.py)
    assert unavailable_reason(torch.float32, False, True) == (None if HAS_CPU else int8_reason())
    int8 = unavailable_reason(torch.bfloat16, False, True)
    assert int8 is None if HAS_INT8 else str(int8).startswith("the CPU lacks")
    assert "KV format" in str(unavailable_reason(torch.bfloat16, True, False))
    # settings it supports: runs where the CPU has the instructions, else names what the CPU lacks
    reason = unavailable_reason(torch.bfloat16, True, True)
    assert reason is None if HAS_CPU else str(reason).startswith("the CPU lacks")


def store_refusal(runner, dtype) -> str:
    """The error the native step of ``runner`` raises for a KV store of ``dtype`` (fails if none)."""
    x = runner.embed_ids([1])
    cos, sin = runner.rope(torch.tensor([0]))
    buffer = runner.new_buffer(16)
    buffer.ensure_storage(runner.kv_heads, runner.head_dim, dtype, runner.device)
    with pytest.raises(RuntimeError) as refused:
        runner.native(x, cos[:, 0], sin[:, 0], [buffer], [0])
    return str(refused.value)


@needs_cpu
def test_each_step_the_cpu_runs_is_chosen_in_order_of_preference(monkeypatch):
    assert step_for(torch.bfloat16).native_class == ("DecodeModel" if HAS_WIDE else "DecodeModelAvx2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # a process narrowed to a CPU without AVX-512
    assert step_for(torch.bfloat16).native_class == "DecodeModelAvx2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert "ATEN_CPU_CAPABILITY=default" in str(unavailable_reason(torch.bfloat16, True, True))


@pytest.mark.skipif(not HAS_WIDE, reason="the CPU lacks AVX512-BF16: only the AVX2 step runs")
def test_the_avx2_step_answers_as_the_avx512_one(runner, loaded_model, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    narrow = FusedLlamaRunner(runner.model)
    assert narrow.native is not None and step_for(torch.bfloat16).native_class == "DecodeModelAvx2"
    # the two steps round where the loop rounds, with float32 sums in other orders (the AVX512-BF16
    # instruction flushes denormals and pairs its products): close, not the same bits. Fed the same
    # tokens, each choice is the wide step's or, where the two disagree, a near-tie of the wide step's
    for text in PROMPTS:
        ids = _prompt(loaded_model, text)
        tokens, wide_rows = _decode(runner, ids, 8, native=True)
        narrow_rows = _forced(narrow, ids, tokens)
        for wide, other in zip(wide_rows, narrow_rows):
            assert torch.nn.functional.cosine_similarity(wide, other, dim=0) > 0.999, text
            pick = int(other.argmax())
            assert pick == int(wide.argmax()) or wide.max() - wide[pick] < NEAR_TIE, text


@needs_cpu
def test_a_store_of_another_format_is_a_clear_error(runner):
    message = store_refusal(runner, torch.float32)
    assert "a KV store must be [layers, 1, kv_heads, capacity > position, head_dim] bf16" in message
