"""The simulated engine makes the real engine's cache decisions exactly (with fake KV of its size)."""

from __future__ import annotations

import random

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.models import kv_bytes_per_token
from rag.benchmark.simulate import FakeKV, SimulatedEngine


@pytest.mark.parametrize(
    ("index", "length"),
    [(slice(2, 5), 3), (slice(None), 10), (slice(8, 20), 2), (slice(5, 5), 0), (slice(-3, None), 3)],
)
def test_fake_kv_slices_like_an_array(index, length):
    kv = FakeKV(10, 46_080)
    assert len(kv[index]) == length and kv[index].nbytes == length * 46_080


def test_fake_kv_copy_and_contiguity():
    kv = FakeKV(4, 8)
    assert kv.copy() is not kv and kv.copy().nbytes == 32
    with pytest.raises(TypeError):
        kv[::2]


def test_bytes_per_token_of_the_bundled_model(loaded_model):
    assert kv_bytes_per_token(loaded_model.model.config, 4) == 46_080


def test_capacity_zero_is_caching_off():
    sim = SimulatedEngine(
        None, model_id="m", max_context=64, config=EngineConfig(cache_bytes=0), bytes_per_token=8
    )
    assert [sim.serve([1, 2, 3]) for _ in range(3)] == [0, 0, 0]
    assert sim.cached_prefix_length([1, 2, 3]) == 0


def _stream(seed: int, n: int) -> list[tuple[list[int], str]]:
    """Shared prefixes, unique suffixes, conversations that extend earlier prompts, two tenants."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 40_000) for _ in range(rng.randint(40, 120))] for _ in range(4)]
    out: list[tuple[list[int], str]] = []
    for _ in range(n):
        tenant = rng.choice(["a", "b"])
        if out and rng.random() < 0.3:
            base, tenant = rng.choice(out)
        else:
            base = rng.choice(prefixes)
        out.append((base + [rng.randrange(100, 40_000) for _ in range(rng.randint(3, 25))], tenant))
    return out


@pytest.mark.parametrize(("eviction", "capacity_tokens"), [("lru", 400), ("gdsf", 300)])
def test_real_engine_hits_equal_the_simulation(loaded_model, eviction, capacity_tokens):
    bpt = kv_bytes_per_token(loaded_model.model.config, 4)
    config = EngineConfig(cache_bytes=capacity_tokens * bpt, eviction=eviction)
    engine = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    sim = SimulatedEngine(
        None, model_id=loaded_model.model_id, max_context=8192, config=config, bytes_per_token=bpt
    )
    try:
        for ids, tenant in _stream(seed=len(eviction), n=20):
            assert engine.cached_prefix_length(ids, tenant) == sim.cached_prefix_length(ids, tenant)
            real = engine.generate(ids, SamplingParams(max_tokens=1), namespace=tenant)
            assert real.cached_tokens == sim.serve(ids, tenant)
            assert engine.cache.used_bytes == sim.cache.used_bytes
        real_stats, sim_stats = engine.cache.stats(), sim.cache.stats()
        assert real_stats.evictions == sim_stats.evictions > 0
        assert (real_stats.hit_tokens, real_stats.nodes) == (sim_stats.hit_tokens, sim_stats.nodes)
    finally:
        engine.close()
