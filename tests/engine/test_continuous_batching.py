"""Continuous batching: a long prompt is prefilled one chunk per engine step, between the running
streams' decode steps, so it never stalls them for its whole prefill; the answers stay as they are.

The structure is asserted on the runner's calls (which call ran when), not on timings."""

from __future__ import annotations

import itertools
import threading

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.engine.reuse_helpers import real_text_ids

MIXED = 64  # mixed_prefill_tokens: chunk size while others decode
RUNNING = SamplingParams(max_tokens=16, ignore_eos=True)
LONG = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(loaded_model):
    config = EngineConfig(
        model=loaded_model.model_id,
        batch_invariant=True,
        mixed_prefill_tokens=MIXED,
        enable_prefix_cache=False,
    )
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    yield eng
    eng.close()


@pytest.fixture
def calls(engine, monkeypatch):
    """The runner's calls in order: ("prefill", buffer id, tokens) and ("decode", buffer ids)."""
    log: list[tuple] = []
    prefill, decode = engine.runner.prefill, engine.runner.decode_batch

    def recorded_prefill(ids, buffer):
        log.append(("prefill", id(buffer), len(ids)))
        return prefill(ids, buffer)

    def recorded_decode(ids, buffers):
        log.append(("decode", tuple(id(b) for b in buffers)))
        return decode(ids, buffers)

    monkeypatch.setattr(engine.runner, "prefill", recorded_prefill)
    monkeypatch.setattr(engine.runner, "decode_batch", recorded_decode)
    return log


def test_a_long_prefill_runs_between_the_decode_steps_of_a_running_stream(engine, calls, loaded_model):
    short = real_text_ids(loaded_model.tokenizer, 40)
    long = real_text_ids(loaded_model.tokenizer, 400)[100:]  # 300 tokens: five chunks of MIXED or fewer
    solo_short = engine.generate(short, RUNNING).token_ids
    solo_long = engine.generate(long, LONG).token_ids
    calls.clear()

    running = engine.stream(short, RUNNING)
    first = next(running)  # its first token is out: it decodes from now on
    late = engine.stream(long, LONG)
    together_long = [t for ev in late for t in ev.token_ids]
    together_short = first.token_ids + [t for ev in running for t in ev.token_ids]

    long_buffer = next(b for kind, b, *rest in calls if kind == "prefill" and rest[0] != len(short))
    chunks = [i for i, call in enumerate(calls) if call[0] == "prefill" and call[1] == long_buffer]
    assert len(chunks) >= len(long) // MIXED  # cut into chunks while the other stream decodes
    assert all(calls[i][2] <= MIXED for i in chunks)
    assert sum(calls[i][2] for i in chunks) == len(long)
    for a, b in itertools.pairwise(chunks):  # a decode step of the running stream between every two chunks
        assert any(call[0] == "decode" for call in calls[a + 1 : b]), calls[a : b + 1]
    assert engine.stats()["mixed_steps"] >= len(chunks) - 1
    # batch_invariant: what runs beside a request changes none of its tokens
    assert together_long == solo_long
    assert together_short == solo_short


def test_alone_a_prompt_is_prefilled_in_full_chunks(engine, calls, loaded_model):
    long = real_text_ids(loaded_model.tokenizer, 600)
    engine.generate(long, SamplingParams(max_tokens=1))
    sizes = [call[2] for call in calls if call[0] == "prefill"]
    assert sizes == [len(long)]  # nothing decodes: no reason to cut it (prefill_chunk_tokens is 1024)


def test_short_prompts_that_arrive_together_start_in_one_step(engine, calls, loaded_model, monkeypatch):
    short = real_text_ids(loaded_model.tokenizer, 40)
    text = real_text_ids(loaded_model.tokenizer, 400)
    prompts = [text[100:120], text[200:220]]  # 20 tokens each: both fit one step's budget of MIXED
    running = engine.stream(short, RUNNING)
    next(running)
    next(running)  # a decode step is done: the step that prefilled it is over, its budget spent
    held = threading.Event()
    held.set()
    pop = engine.scheduler.pop
    monkeypatch.setattr(engine.scheduler, "pop", lambda: None if held.is_set() else pop())
    late = [engine.stream(ids, LONG) for ids in prompts]  # both wait before the step that takes them
    calls.clear()
    held.clear()
    for stream in late:
        assert len([t for ev in stream for t in ev.token_ids]) == LONG.max_tokens
    running.close()

    kinds = [call[0] for call in calls]
    first = kinds.index("prefill")
    assert kinds[first : first + 2] == ["prefill", "prefill"]  # no decode step between the two
    assert [call[2] for call in calls[first : first + 2]] == [len(ids) for ids in prompts], calls[:12]
    assert calls[first][1] != calls[first + 1][1]
    assert "decode" in kinds[first + 2 :]
