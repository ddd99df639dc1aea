"""Reuse of cached KV is exact: cached and uncached logits (and KV) are equal bit for bit.

Prompts of real text up to 4,096 tokens (the model's context is 8,192), cached prefixes on and off the
64-token block and the prefill-chunk boundaries, from earlier prompts of the same, a longer and a
shorter length, suffixes of 1 to 300 tokens (and one longer than a chunk), for the fused and the
transformers runner; then the next turn of a conversation, whose prefix holds decoded KV.
"""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.fused import FusedLlamaRunner
from engine.kv import BLOCK_TOKENS as BLOCK
from engine.runner import ModelRunner
from tests.engine.reuse_helpers import CHUNK, ColdAndWarm, assert_as_stated, prefill, real_text_ids

LONG = 4096

# (cached prefix, prompt length, length of the earlier prompt the prefix's KV came from)
FUSED_POINTS = [
    (LONG - 1, LONG, LONG),  # the same 4k prompt again: one token computed, prefix off a block boundary
    (LONG - BLOCK, LONG, LONG),  # prefix on a block boundary, a one-block suffix
    (LONG - 300, LONG, LONG),  # a 300-token suffix
    (CHUNK - 1, CHUNK + 76, LONG),  # prefix one short of a chunk boundary: the suffix straddles it
    (CHUNK + 1, CHUNK + 6, LONG),  # one past it
    (2 * CHUNK, 2 * CHUNK + 63, LONG),  # on a chunk (and block) boundary
    (3 * CHUNK - 2 * BLOCK, 3 * CHUNK + 28, LONG),  # on a block boundary, suffix straddles a chunk's
    (1000, 2 * CHUNK + 52, LONG),  # a suffix longer than a chunk: chunked from 1000, not from 0
    (63, 100, LONG),  # a short prompt, one short of a block
    (BLOCK, BLOCK + 1, LONG),  # one token after one block
    (2 * BLOCK + 1, 2 * BLOCK + 41, 2 * BLOCK + 1),  # the prefix came from a shorter prompt
]
HF_LONG = CHUNK + 76  # the transformers forward is slower: prompts up to one chunk boundary
HF_POINTS = [
    (HF_LONG - 1, HF_LONG, HF_LONG),
    (HF_LONG - 300, HF_LONG, HF_LONG),
    (CHUNK - 1, HF_LONG, HF_LONG),
    (63, 100, HF_LONG),
    (2 * BLOCK + 1, 2 * BLOCK + 41, 2 * BLOCK + 1),
]


@pytest.fixture(scope="module")
def long_prompt(loaded_model) -> list[int]:
    assert loaded_model.model.config.max_position_embeddings >= LONG
    return real_text_ids(loaded_model.tokenizer, LONG)


@pytest.fixture(scope="module")
def fused_runs(loaded_model, long_prompt) -> ColdAndWarm:
    return ColdAndWarm(FusedLlamaRunner(loaded_model.model), long_prompt)


@pytest.fixture(scope="module")
def hf_runs(loaded_model, long_prompt) -> ColdAndWarm:
    return ColdAndWarm(ModelRunner(loaded_model.model), long_prompt[:HF_LONG])


@pytest.mark.parametrize(("cached", "n", "source"), FUSED_POINTS)
def test_fused_runner_reuse_is_bit_exact(fused_runs, cached, n, source):
    fused_runs.assert_as_stated(cached, n, source)


@pytest.mark.parametrize(("cached", "n", "source"), HF_POINTS)
def test_transformers_runner_reuse_is_bit_exact(hf_runs, cached, n, source):
    hf_runs.assert_as_stated(cached, n, source)


def test_cold_reference_equals_a_fresh_run(fused_runs):
    """The cold reference's shortcut (the long run's leading chunks) changes nothing."""
    n = CHUNK + 6
    fresh = fused_runs.runner.new_buffer(n)
    logits = prefill(fused_runs.runner, fresh, fused_runs.ids[:n])
    assert torch.equal(logits, fused_runs.cold(n)[0])


# ---- the next turn: the engine caches prompt + completion, and decode wrote the completion's KV ----
def next_turn(runner, ids: list[int], batch_mates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached and uncached logits of a second turn whose cached prefix is the first turn's prompt and
    greedy completion (decoded in one batch with ``batch_mates`` other requests)."""
    prompts = [ids[:150], ids[200:300], ids[400:480]][: 1 + batch_mates]
    buffers = [runner.new_buffer(len(p) + 16) for p in prompts]
    tokens = [[int(prefill(runner, b, p).argmax())] for p, b in zip(prompts, buffers)]
    for _ in range(12):
        rows = runner.decode_batch([seq[-1] for seq in tokens], buffers)
        for seq, row in zip(tokens, rows):
            seq.append(int(row.argmax()))
    held = buffers[0].length  # prompt + completion but its last token, as the engine caches it
    second = prompts[0] + tokens[0] + ids[500:530]
    warm = runner.new_buffer(len(second))
    warm.load_prefix([buffers[0].segment(0, held)])
    warm_logits = prefill(runner, warm, second[held:])
    cold_logits = prefill(runner, runner.new_buffer(len(second)), second)
    return warm_logits, cold_logits


def test_next_turn_is_bit_exact_when_batch_invariant(loaded_model, long_prompt):
    runner = FusedLlamaRunner(loaded_model.model, batch_invariant=True)
    warm, cold = next_turn(runner, long_prompt, batch_mates=2)
    assert torch.equal(warm, cold)


@pytest.mark.parametrize("kind", ["fused", "transformers"])
def test_next_turn_otherwise_differs_by_rounding_only(loaded_model, long_prompt, kind):
    """A one-row decode matmul rounds differently from a prefill's: the completion's KV, and so the
    next turn's logits, match a fresh prefill to float32 rounding (README states this bound)."""
    model = loaded_model.model
    runner = FusedLlamaRunner(model) if kind == "fused" else ModelRunner(model)
    warm, cold = next_turn(runner, long_prompt, batch_mates=0)
    assert int(warm.argmax()) == int(cold.argmax())
    torch.testing.assert_close(warm, cold, atol=1e-3, rtol=0)


def test_engine_first_token_logits_are_bit_exact(engine, engine_nocache, long_prompt, monkeypatch):
    """The same through the engine: recycled buffers, slab-backed cache blocks, prefill chunked from
    the match. The logits each engine samples the first token from are recorded on their way out."""
    sampled = {}
    for name, eng in (("cached", engine), ("uncached", engine_nocache)):

        def recording(ids, buffer, real=eng.runner.prefill, name=name):
            sampled[name] = real(ids, buffer)
            return sampled[name]

        monkeypatch.setattr(eng.runner, "prefill", recording)
    one = SamplingParams(max_tokens=1)
    earlier = long_prompt[:1500] + long_prompt[3000:3050]  # shares 1,500 tokens, then diverges
    engine.generate(earlier, one, namespace="exact-logits")
    warm = engine.generate(long_prompt[:2100], one, namespace="exact-logits")
    engine_nocache.generate(long_prompt[:2100], one)
    assert warm.cached_tokens == 1500
    assert_as_stated(engine.runner, sampled["cached"], sampled["uncached"], "through the engine")
