"""bfloat16 end to end: reuse of cached KV is exact within bfloat16, and the answers are sensible."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.fused import FusedLlamaRunner
from engine.models import load_model
from tests.engine.reuse_helpers import CHUNK, ColdAndWarm, real_text_ids

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
LONG = CHUNK + 76


@pytest.fixture(scope="module")
def bf16_model():
    loaded = load_model("smollm2-135m-instruct", dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    return loaded


@pytest.fixture(scope="module")
def bf16_runs(bf16_model) -> ColdAndWarm:
    return ColdAndWarm(FusedLlamaRunner(bf16_model.model), real_text_ids(bf16_model.tokenizer, LONG))


@pytest.mark.parametrize(
    ("cached", "n", "source"),
    [(LONG - 1, LONG, LONG), (CHUNK - 1, CHUNK + 76, LONG), (129, 169, 129), (63, 100, LONG)],
)
def test_bf16_reuse_is_bit_exact(bf16_runs, cached, n, source):
    bf16_runs.assert_as_stated(cached, n, source)


def test_bf16_engine_answers_and_reuse_changes_no_token(bf16_model):
    def engine(**options) -> Engine:
        config = EngineConfig(model=bf16_model.model_id, dtype="bfloat16", **options)
        return Engine(bf16_model.model, bf16_model.tokenizer, model_id=bf16_model.model_id, config=config)

    cached, plain = engine(), engine(enable_prefix_cache=False)
    try:
        capital = [{"role": "user", "content": "What is the capital of France?"}]
        assert "Paris" in cached.generate(capital, GREEDY).text
        context = "The Zorblax project started in 2019 in Lyon; its secret code is 4417. " * 4
        system = {"role": "system", "content": "Answer from the context.\n\nContext:\n" + context}
        first = [system, {"role": "user", "content": "Where did the project start?"}]
        second = [system, {"role": "user", "content": "What is the secret code?"}]
        cached.generate(first, GREEDY)
        warm = cached.generate(second, GREEDY)
        assert warm.cached_tokens > 0
        assert warm.token_ids == plain.generate(second, GREEDY).token_ids
        assert any(fact in warm.text for fact in ("4417", "Zorblax", "Lyon", "2019")), warm.text
    finally:
        cached.close()
        plain.close()
