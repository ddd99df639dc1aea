"""Saved logits (engine/saved_logits.py): a request whose whole prompt the cache holds computes none of
it, answers exactly as a full prefill does, and never takes another tenant's logits; without its KV,
or with the feature off (``saved_logits=0``; on by default), the last token is computed again."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.saved_logits import SavedLogits

GREEDY = SamplingParams(max_tokens=10, temperature=0.0)
SAMPLED = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=7)
PROMPT = "The lighthouse on Kerran Point was built in 1871 and its keeper is Ilse Marchetti. Who keeps it?"


@pytest.fixture(scope="module")
def engine(loaded_model):
    config = EngineConfig(model=loaded_model.model_id)
    assert config.saved_logits > 0  # on by default
    with Engine(
        loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def ids(engine):
    return engine.encode(PROMPT)


def test_a_whole_cached_prompt_computes_nothing_and_answers_the_same(engine, engine_nocache, ids):
    first = engine.generate(ids, GREEDY, namespace="sl-a")
    hits = engine.stats()["saved_logits_hits"]
    again = engine.generate(ids, GREEDY, namespace="sl-a")
    assert again.cached_tokens == len(ids)  # nothing of the prompt computed
    assert engine.stats()["saved_logits_hits"] == hits + 1
    assert again.token_ids == first.token_ids == engine_nocache.generate(ids, GREEDY).token_ids
    sampled = [engine.generate(ids, SAMPLED, namespace="sl-a").token_ids for _ in range(2)]
    assert sampled[0] == sampled[1] == engine_nocache.generate(ids, SAMPLED).token_ids


def test_another_tenant_computes_its_own(engine, ids):
    engine.generate(ids, GREEDY, namespace="sl-b")
    other = engine.generate(ids, GREEDY, namespace="sl-c")
    assert other.cached_tokens == 0


def test_a_prompt_whose_kv_left_the_cache_computes_its_last_token(engine, ids):
    engine.generate(ids, GREEDY, namespace="sl-d")
    engine.cache.reset()  # the KV goes; the saved logits alone cannot answer
    assert engine.saved_logits.get(engine._namespace("sl-d"), ids) is not None
    again = engine.generate(ids, GREEDY, namespace="sl-d")
    assert (
        again.cached_tokens == 0
        and again.token_ids == engine.generate(ids, GREEDY, namespace="sl-e").token_ids
    )


def test_off_recomputes_the_last_token(loaded_model, ids):
    config = EngineConfig(model=loaded_model.model_id, saved_logits=0)
    with Engine(
        loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config
    ) as eng:
        eng.generate(ids, GREEDY)
        assert eng.generate(ids, GREEDY).cached_tokens == len(ids) - 1


def test_the_store_is_bounded_and_keyed_by_tenant_and_every_token():
    saved = SavedLogits(2)
    for n in range(3):
        saved.put("t", [1, 2, n], torch.full((4,), float(n)))
    assert len(saved) == 2 and saved.get("t", [1, 2, 0]) is None  # the least recent went
    assert saved.get("t", [1, 2, 2]).tolist() == [2.0] * 4
    assert saved.get("u", [1, 2, 2]) is None and saved.get("t", [1, 2]) is None
    assert saved.nbytes == 2 * 4 * 4
