"""dtype="auto": bfloat16 where the CPU multiplies it natively, float32 elsewhere; the engine says which
and why."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig
from engine.dtype import choose_dtype, cpu_bf16_flags, engine_dtype

NONE = {"amx_bf16": False, "avx512_bf16": False}


def test_auto_follows_the_cpu_flags(monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    assert choose_dtype("auto", flags=NONE).dtype == "float32"
    assert "neither" in choose_dtype("auto", flags=NONE).reason
    amx = choose_dtype("auto", flags={"amx_bf16": True, "avx512_bf16": False})
    assert amx.dtype == "bfloat16" and "amx_bf16" in amx.reason
    assert choose_dtype("auto", flags={"amx_bf16": False, "avx512_bf16": True}).dtype == "bfloat16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # kernels kept off the bfloat16 instructions
    narrowed = choose_dtype("auto", flags={"amx_bf16": True, "avx512_bf16": True})
    assert narrowed.dtype == "float32" and "ONEDNN_MAX_CPU_ISA=AVX2" in narrowed.reason


def test_explicit_dtypes_stay_and_others_are_refused():
    assert choose_dtype("float32").dtype == "float32" and choose_dtype("bfloat16").dtype == "bfloat16"
    with pytest.raises(ValueError, match="'auto', 'float32' or 'bfloat16'"):
        choose_dtype("float16")
    with pytest.raises(ValueError):
        EngineConfig(dtype="float16")  # type: ignore[arg-type]
    assert EngineConfig().dtype == "auto"


def test_an_engine_around_a_loaded_model_reports_the_model_dtype(loaded_model):
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    try:
        reported = eng.stats()["dtype"]
        assert reported == engine_dtype("auto", "float32").to_dict()
        assert reported["dtype"] == "float32"  # the session's model is float32, whatever the CPU
        if choose_dtype("auto").dtype == "bfloat16":
            assert "caller's model is float32" in reported["reason"]
    finally:
        eng.close()


def test_from_pretrained_loads_the_auto_dtype():
    eng = Engine.from_pretrained(cache_bytes=1 << 24)
    try:
        wanted = choose_dtype("auto")
        assert eng.stats()["dtype"] == wanted.to_dict()
        assert eng.runner.dtype == getattr(torch, wanted.dtype)
        assert eng.stats()["kv"]["kv_dtype"] == wanted.dtype  # KV as stored: the compute dtype
        if eng.runner.packed:  # its own packed copies: the model's float Linears were freed
            assert eng.runner.model.model.layers[0].mlp.down_proj.weight.numel() == 0
            # every weight once, plus the packed lm_head beside the tied embedding (bfloat16 326 MB,
            # float32 651 MB) where prefill and decode read the same tiles; where oneDNN packs the
            # prefill's Linears (AMX) the native decode step holds tiles of its own beside them
            once = _parameters(eng.runner.config) * eng.runner.embed.element_size()
            shared = eng.runner.tiled or eng.runner.native is None
            assert eng.stats()["weight_bytes"] <= (1.01 if shared else 2) * once
        answer = eng.generate([{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in answer.text
        flags = cpu_bf16_flags()
        assert (wanted.dtype == "bfloat16") == any(flags.values()) or "narrows" in wanted.reason
    finally:
        eng.close()


def _parameters(cfg) -> int:
    """A Llama-family model's weights, the lm_head counted apart from a tied embedding."""
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size // cfg.num_attention_heads
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    layer = h * qkv + cfg.num_attention_heads * d * h + 3 * h * inter + 2 * h
    return 2 * cfg.vocab_size * h + cfg.num_hidden_layers * layer + h
