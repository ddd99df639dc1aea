"""The oracle (an unbounded cache) and its agreement with the simulated engine at unbounded capacity."""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from rag.benchmark.oracle import PrefixOracle, oracle_hits
from rag.benchmark.simulate import SimulatedEngine


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        ([([1, 2, 3], "")], [0]),
        ([([1, 2, 3], ""), ([1, 2, 3], "")], [0, 2]),  # capped at len - 1
        ([([1, 2, 3], ""), ([1, 2, 9, 9], "")], [0, 2]),
        ([([1, 2, 3], ""), ([1, 2, 3], "b")], [0, 0]),  # namespaces never share
        ([([1, 2, 3, 4, 5], ""), ([1, 2], ""), ([1, 2, 3, 4, 5, 6], "")], [0, 1, 5]),
        ([([7], ""), ([7], "")], [0, 0]),  # a one-token prompt always computes its token
        ([([1, 2], ""), ([3, 4], ""), ([1, 2, 3, 4], "")], [0, 0, 2]),
    ],
)
def test_oracle_hits(stream, expected):
    assert oracle_hits(stream) == expected


def test_peek_has_no_side_effects_and_counts_tokens():
    o = PrefixOracle()
    assert o.peek([1, 2]) == 0
    o.serve([1, 2, 3])
    assert o.peek([1, 2, 3, 4]) == 3 and o.peek([1, 2, 3, 4]) == 3
    assert (o.prompt_tokens, o.hit_tokens, o.cached_tokens) == (3, 0, 3)
    o.serve([1, 2, 5])
    assert (o.hit_tokens, o.cached_tokens, o.hit_rate) == (2, 4, pytest.approx(2 / 6))


def _stream(seed: int, n: int = 300) -> list[tuple[list[int], str]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(1, 40))] for _ in range(8)]
    out = []
    for _ in range(n):
        ids = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(0, 10))]
        out.append((ids, rng.choice(["", "t1"])))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_unbounded_radix_cache_equals_the_oracle(seed):
    sim = SimulatedEngine(
        None, model_id="m", max_context=4096, config=EngineConfig(cache_bytes=1 << 40), bytes_per_token=8
    )
    stream = _stream(seed)
    assert [sim.serve(ids, ns) for ids, ns in stream] == oracle_hits(stream)
    assert sim.cache.stats().cached_tokens == _oracle_tokens(stream)


def _oracle_tokens(stream: list[tuple[list[int], str]]) -> int:
    o = PrefixOracle()
    for ids, ns in stream:
        o.serve(ids, ns)
    return o.cached_tokens


@pytest.mark.parametrize(
    ("seed", "capacity_tokens", "eviction"), [(0, 30, "lru"), (1, 60, "gdsf"), (2, 5, "lru")]
)
def test_a_bounded_cache_never_beats_the_oracle(seed, capacity_tokens, eviction):
    config = EngineConfig(cache_bytes=capacity_tokens * 8, eviction=eviction)
    sim = SimulatedEngine(None, model_id="m", max_context=4096, config=config, bytes_per_token=8)
    stream = _stream(seed)
    hits = [sim.serve(ids, ns) for ids, ns in stream]
    assert all(h <= o for h, o in zip(hits, oracle_hits(stream)))
    assert sim.cache.used_bytes <= config.cache_bytes
    assert sim.cache.stats().evictions > 0
