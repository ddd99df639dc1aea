"""A prefix that ends inside a 64-token block comes back from a tier to its last shared token, as it
does from RAM: prompts that share a system prompt and then diverge, written, then read after a restart.
Outputs equal caching off's, logits as the engine states for this machine (bit-equal where exact)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.kv import BLOCK_TOKENS
from prefix_cache.keys import common_prefix_len
from tests.engine.reuse_helpers import assert_as_stated, real_text_ids

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
SYSTEM_TOKENS = 2 * BLOCK_TOKENS + 22  # ends 22 tokens into the third block
WORDS = ("harbours", "ledgers", "lanterns")


def _engine(loaded, folder, **config) -> Engine:
    cfg = EngineConfig(disk_cache_dir=folder, **config) if folder else EngineConfig(**config)
    return Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=cfg)


@pytest.fixture(scope="module")
def prompts(loaded_model) -> list[list[int]]:
    system = real_text_ids(loaded_model.tokenizer, SYSTEM_TOKENS)
    questions = [
        loaded_model.tokenizer.encode(f" {w.title()}: what does the text say about {w}?") for w in WORDS
    ]
    assert len({q[0] for q in questions}) == len(WORDS)  # the prompts part at the system prompt's end
    return [system + q for q in questions]


@pytest.fixture(scope="module")
def written(loaded_model, prompts, tmp_path_factory) -> Path:
    """A disk tier's folder after an engine served the earlier prompts (then stopped)."""
    folder = tmp_path_factory.mktemp("written")
    *earlier, probe = prompts
    writer = _engine(loaded_model, folder)
    try:
        for prompt in earlier:
            writer.generate(prompt, GREEDY)
        assert writer.cached_prefix_length(probe) == SYSTEM_TOKENS  # what RAM reuses
        assert writer.tiers.flush(60)
    finally:
        writer.close()
    return folder


def test_a_restart_reuses_a_shared_prefix_to_its_last_token(loaded_model, prompts, written, tmp_path):
    *earlier, probe = prompts
    assert max(common_prefix_len(p, probe, 0, len(probe)) for p in earlier) == SYSTEM_TOKENS
    folder = shutil.copytree(written, tmp_path / "kv")
    off = _engine(loaded_model, None, enable_prefix_cache=False)
    restarted = _engine(loaded_model, folder)
    try:
        r = restarted.generate(probe, GREEDY)
        assert r.cached_tokens == SYSTEM_TOKENS  # as from RAM, not the 128 of whole blocks only
        assert r.token_ids == off.generate(probe, GREEDY).token_ids
        disk = restarted.stats()["disk"]
        assert disk["hit_tokens"] == SYSTEM_TOKENS and disk["read_blocks"] == 3 and disk["rejected"] == 0
    finally:
        restarted.close()
        off.close()


def test_logits_after_a_partly_used_block_are_as_computed(loaded_model, prompts, written, tmp_path):
    probe = prompts[-1]
    eng = _engine(loaded_model, shutil.copytree(written, tmp_path / "kv"))
    try:
        runner = eng.runner
        loaded = runner.new_buffer(len(probe))
        assert eng.tiers.extend(loaded, probe, eng._namespace(""), limit=len(probe) - 1) == SYSTEM_TOKENS
        cold = runner.prefill(probe, runner.new_buffer(len(probe)))
        assert_as_stated(
            runner, runner.prefill(probe[SYSTEM_TOKENS:], loaded), cold, "third block, 22 tokens"
        )
    finally:
        eng.close()
