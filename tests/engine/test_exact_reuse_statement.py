"""The engine states whether reuse is bit-exact on this machine, and the statement is earned: the
self-check catches a runner whose results depend on the split, and the base tiles alone (every
matmul in 16-row calls, every attention call one 16-row query tile) are exact on any CPU."""

from __future__ import annotations

from engine import Engine, EngineConfig
from engine.exact_reuse import check_exact_reuse
from engine.fused import FusedLlamaRunner
from engine.row_tiles import BASE_MENU


def test_the_engine_states_its_verdict_with_a_reason(engine, engine_nocache):
    stats = engine.stats()
    assert isinstance(stats["exact_reuse"], bool)
    assert "530-token prompt" in stats["exact_reuse_reason"]
    assert stats["exact_reuse"] == check_exact_reuse(engine.runner).exact
    off = engine_nocache.stats()
    assert off["exact_reuse"] is None and "caching is off" in off["exact_reuse_reason"]


def test_the_check_can_be_turned_off(loaded_model):
    config = EngineConfig(model=loaded_model.model_id, check_exact_reuse=False, cache_bytes=1 << 24)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        assert eng.stats()["exact_reuse"] is None
        assert "not checked" in eng.stats()["exact_reuse_reason"]
    finally:
        eng.close()


class _SplitDependent(FusedLlamaRunner):
    """A runner whose logits depend on the call's length (as a kernel choosing by row count would)."""

    def prefill(self, token_ids, buffer):
        logits = super().prefill(token_ids, buffer)
        return logits + len(token_ids) * 1e-6


def test_the_check_catches_a_split_dependent_runner(loaded_model):
    verdict = check_exact_reuse(_SplitDependent(loaded_model.model))
    assert verdict.exact is False
    assert "logits differ by up to" in verdict.reason


def test_base_tiles_alone_are_exact_on_any_cpu(loaded_model):
    """With no calibrated menu at all, every call has one shape per operation: exact by construction."""
    runner = FusedLlamaRunner(loaded_model.model)
    runner.menus = {shape: BASE_MENU for shape in runner.menus}
    runner.attention_tiles = BASE_MENU
    verdict = check_exact_reuse(runner)
    assert verdict.exact is True, verdict.reason
