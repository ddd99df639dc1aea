"""Backends and runners state what they implement (engine.backend, engine.runners), and the statement is
true: each stated capability's protocol is there, and what is not stated is not used."""

from __future__ import annotations

import doctest
import importlib

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.backend import BackendCapabilities, CacheProbe, LocalCache, cache_probe, local_cache
from engine.fused import FusedLlamaRunner
from engine.runner import ModelRunner
from engine.runners import NO_STITCHING, RunnerCapabilities, stitching_runner


@pytest.fixture(scope="module")
def hf_engine(loaded_model):
    """The bundled model on the transformers runner."""
    config = EngineConfig(model=loaded_model.model_id, runner="hf")
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    yield eng
    eng.close()


def test_the_engine_states_every_optional_capability_and_implements_it(engine):
    assert engine.capabilities == BackendCapabilities(
        prefix_probe=True, public_prefix=True, chunk_reuse=True, local_cache=True
    )
    assert isinstance(engine, CacheProbe) and isinstance(engine, LocalCache)
    assert cache_probe(engine) is engine and local_cache(engine) is engine
    ids = engine.encode("The stated capabilities of an engine")
    engine.generate(ids, SamplingParams(max_tokens=1), namespace="caps")
    assert cache_probe(engine).cached_prefix_length(ids, "caps") == len(ids)  # type: ignore[union-attr]
    assert engine.flush_tiers() is None  # no tier under RAM here


def test_the_fused_runner_states_batched_decode_and_chunk_stitching(engine):
    assert isinstance(engine.runner, FusedLlamaRunner)
    assert engine.runner.capabilities == RunnerCapabilities(
        batched_decode=True, int8_weights=False, stitch_blocker=None
    )
    assert engine.runner.capabilities.chunk_stitching
    assert stitching_runner(engine.runner) is engine.runner and engine.stitcher is not None


def test_the_transformers_runner_states_that_it_neither_batches_nor_stitches(hf_engine):
    runner = hf_engine.runner
    assert isinstance(runner, ModelRunner)
    assert runner.capabilities == RunnerCapabilities()
    assert not runner.capabilities.batched_decode and not runner.capabilities.int8_weights
    assert stitching_runner(runner) is None and hf_engine.stitcher is None
    assert hf_engine.chunks_blocker == NO_STITCHING
    assert not hf_engine.capabilities.chunk_reuse and hf_engine.capabilities.prefix_probe
    # what it does state still works: decode one sequence at a time, count its weights once
    ids = hf_engine.encode("Decode without a batch")
    r = hf_engine.generate(ids, SamplingParams(max_tokens=3), reuse="chunks", chunk_spans=[(1, 3)])
    assert r.completion_tokens > 0 and r.reuse == "prefix"
    params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in runner.model.parameters()}
    assert hf_engine.stats()["weight_bytes"] == runner.weight_bytes() == sum(params.values())


@pytest.mark.parametrize("name", ["engine.backend", "engine.runners"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
