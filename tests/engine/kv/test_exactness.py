"""Exact reuse for every KV storage format (kv_dtype): what the cache gives back is bit for bit what
the model computed and attended over, and a cached prefix gives the same logits as computing it.

Parametrized over kv_dtype so the float32 exactness matrix (longer prompts, more prefix lengths) can
add its cases here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.fused import FusedLlamaRunner
from engine.kv import BLOCK_TOKENS, KVBuffer
from engine.kv.block_pool import KVBlockPool
from engine.kv.codec import KV_DTYPES, make_codec
from engine.runner import ModelRunner
from prefix_cache import RadixCache
from tests.engine.reuse_helpers import assert_as_stated

TEXT = (
    "A radix tree keyed by token ids lets requests that share a prompt prefix reuse its attention keys "
    "and values. The engine rounds every key and value it computes to the storage format first, so a "
    "prefix loaded from the cache is exactly the prefix the model would have computed. "
) * 6
_runners: dict[tuple[str, str], Any] = {}


@pytest.fixture(scope="module")
def prompt(loaded_model) -> list[int]:
    ids = loaded_model.tokenizer.encode(TEXT)[:160]
    assert len(ids) == 160
    return ids


def _runner(loaded_model, kind: str, kv_dtype: str) -> Any:
    key = (kind, kv_dtype)
    if key not in _runners:
        codec = make_codec(kv_dtype, torch.float32)
        model = loaded_model.model
        _runners[key] = (
            FusedLlamaRunner(model, kv_codec=codec) if kind == "fused" else ModelRunner(model, kv_codec=codec)
        )
    return _runners[key]


def _through_the_cache(runner: Any, prompt: list[int], prefix_len: int) -> tuple[KVBuffer, KVBuffer, int]:
    """A first request computes the prefix and the cache keeps it (pooled blocks, as the engine does);
    a second request loads it. Returns (first's buffer, second's buffer, tokens loaded)."""
    cache = RadixCache(capacity_bytes=1 << 30)
    pool = KVBlockPool(BLOCK_TOKENS, 8 << 20)
    first = runner.new_buffer(len(prompt))
    runner.prefill(prompt[:prefix_len], first)
    cache.insert(prompt[:prefix_len], first.segment(0, prefix_len, pool))
    match = cache.match_prefix(prompt, max_length=len(prompt) - 1)
    second = runner.new_buffer(len(prompt))
    second.load_prefix(match.values)
    return first, second, match.length


CASES = [
    *[("fused", kv, 100) for kv in KV_DTYPES],  # off a block boundary: the radix split copies a part block
    ("fused", "int8", 64),
    ("fused", "int8", 130),
    ("hf", "float32", 100),  # transformers' forward rounds in KVBuffer.update, the same codec for all formats
    ("hf", "int8", 100),
]


@pytest.mark.parametrize(("kind", "kv_dtype", "prefix_len"), CASES)
def test_a_loaded_prefix_is_the_computed_prefix_in_kv_and_logits(
    loaded_model, prompt, kind, kv_dtype, prefix_len
):
    """The cache gives back bit for bit the KV the model computed and attended over, and the suffix
    computed after loading it gives the logits of the suffix computed after computing it."""
    runner = _runner(loaded_model, kind, kv_dtype)
    first, second, loaded = _through_the_cache(runner, prompt, prefix_len)
    assert loaded == prefix_len
    for got, want in zip(second.stores(), first.stores()):
        assert got.dtype == torch.float32
        assert torch.equal(got[:, :, :, :loaded], want[:, :, :, :loaded])
    codec = make_codec(kv_dtype, torch.float32)
    keys = first.stores()[0][:, 0, :, :loaded]
    assert torch.equal(codec.round(keys), keys)  # it really is in the storage precision
    computed = runner.prefill(prompt[loaded:], first)
    reused = runner.prefill(prompt[loaded:], second)
    assert torch.equal(reused, computed)


# Against one full prefill, bit equality also needs attention whose rounding does not depend on how
# many query rows share a call: engine.prefill_shapes provides that; the storage formats add no
# difference of their own (above).
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("prefix_len", [64, 100])
def test_cached_logits_equal_one_full_prefill(loaded_model, prompt, kv_dtype, prefix_len):
    runner = _runner(loaded_model, "fused", kv_dtype)
    cold = _full_prefill(runner, kv_dtype, prompt)
    _, second, loaded = _through_the_cache(runner, prompt, prefix_len)
    assert_as_stated(runner, runner.prefill(prompt[loaded:], second), cold, f"{kv_dtype} KV")


_full: dict[str, torch.Tensor] = {}


def _full_prefill(runner: Any, kv_dtype: str, prompt: list[int]) -> torch.Tensor:
    if kv_dtype not in _full:
        _full[kv_dtype] = runner.prefill(prompt, runner.new_buffer(len(prompt)))
    return _full[kv_dtype]


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
def test_each_format_really_changes_the_computation(loaded_model, prompt, kv_dtype):
    """The rounding is applied on the fresh path too: a compact format's uncached logits differ from
    float32 KV's (slightly), which is the fidelity cost the benchmark measures."""
    exact = _full_prefill(_runner(loaded_model, "fused", "float32"), "float32", prompt)
    rounded = _full_prefill(_runner(loaded_model, "fused", kv_dtype), kv_dtype, prompt)
    assert not torch.equal(exact, rounded)
    assert int(exact.argmax()) == int(rounded.argmax())
