"""Engine behaviour with the real bundled model: reuse changes nothing, locks are always released."""

import threading

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.request import EngineError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)

DOC = (
    "The Zorblax project started in 2019 in Lyon. Its secret code is 4417. The team has nine members, "
    "led by Ada Brennan, and meets every Tuesday. The project studies prefix caching for small language models. "
)


def _chat(question: str, context: str = DOC) -> list[dict]:
    return [
        {"role": "system", "content": "Answer from the context.\n\nContext:\n" + context * 3},
        {"role": "user", "content": question},
    ]


def test_answers_paris(engine):
    r = engine.generate([{"role": "user", "content": "What is the capital of France?"}], GREEDY)
    assert "Paris" in r.text
    assert r.finish_reason in ("stop", "length")
    assert r.prompt_tokens > 0 and r.ttft_s > 0 and r.total_s >= r.ttft_s


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("What is the secret code?", "Who leads the team?"),  # shared system prefix, different question
        ("Who leads the team?", "Who leads the team?"),  # identical prompt: all but one token reused
        ("When does the team meet?", "When does the team meet? Answer briefly."),  # ends mid-node
    ],
)
def test_cached_output_equals_uncached(engine, engine_nocache, first, second):
    ns = f"eq-{first}-{second}"
    engine.generate(_chat(first), GREEDY, namespace=ns)
    cached = engine.generate(_chat(second), GREEDY, namespace=ns)
    fresh = engine_nocache.generate(_chat(second), GREEDY, namespace=ns)
    assert cached.token_ids == fresh.token_ids
    assert cached.text == fresh.text
    ids_first = engine.encode(_chat(first))
    ids_second = engine.encode(_chat(second))
    common = 0
    for a, b in zip(ids_first, ids_second):
        if a != b:
            break
        common += 1
    # the whole of a repeated prompt (its logits were saved), else the common prefix up to the last token
    whole = ids_first == ids_second
    assert cached.cached_tokens == (len(ids_second) if whole else min(common, len(ids_second) - 1))
    assert fresh.cached_tokens == 0


def test_no_shared_prefix_reuses_nothing(engine):
    engine.generate("Alpha beta gamma delta.", GREEDY, namespace="cold")
    r = engine.generate("Zeta eta theta iota.", GREEDY, namespace="cold")
    assert r.cached_tokens == 0


def test_next_turn_hits_prompt_and_completion(engine):
    ns = "multiturn"
    turn1 = _chat("What is the secret code?")
    r1 = engine.generate(turn1, GREEDY, namespace=ns)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": "And who leads it?"},
    ]
    r2 = engine.generate(turn2, GREEDY, namespace=ns)
    assert r2.cached_tokens >= r1.prompt_tokens  # the first turn's prompt, at least, was reused


def test_namespaces_do_not_share(engine):
    prompt = _chat("Where did the project start?")
    engine.generate(prompt, GREEDY, namespace="tenant-a")
    b = engine.generate(prompt, GREEDY, namespace="tenant-b")
    assert b.cached_tokens == 0
    a = engine.generate(prompt, GREEDY, namespace="tenant-a")
    assert a.cached_tokens == a.prompt_tokens  # its own KV and saved logits


def test_stream_first_event_carries_ttft_and_cached_tokens(engine):
    events = list(engine.stream(_chat("How many members?"), GREEDY, namespace="stream"))
    first, last = events[0], events[-1]
    assert first.ttft_s is not None and first.cached_tokens is not None and first.prompt_tokens
    assert last.finish_reason in ("stop", "length")
    assert "".join(e.text for e in events) == last.result.text


def test_stop_string_and_length(engine):
    r = engine.generate("Count: one, two, three,", SamplingParams(max_tokens=40, stop=[","]))
    assert "," not in r.text and r.finish_reason == "stop"
    r = engine.generate("Count: one, two, three,", SamplingParams(max_tokens=3))
    assert r.finish_reason == "length" and len(r.token_ids) == 3


def test_seeded_sampling_is_reproducible(engine):
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=123)
    a = engine.generate("Write a word:", params)
    b = engine.generate("Write a word:", params)
    assert a.token_ids == b.token_ids


def test_cancelled_stream_releases_locks(engine):
    stream = engine.stream(_chat("Tell me everything about the project."), SamplingParams(max_tokens=200))
    next(stream)
    stream.close()  # the consumer goes away mid-generation
    assert engine.cache.stats().protected_bytes == 0
    assert engine.stats()["running"] == 0


def test_error_mid_generation_releases_locks_and_engine_keeps_serving(engine, monkeypatch):
    prompt = _chat("What is the secret code?")
    engine.generate(prompt, GREEDY, namespace="err")
    calls = {"n": 0}
    real = engine.runner.decode_batch

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated kernel failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode_batch", failing)
    with pytest.raises(EngineError, match="simulated kernel failure"):
        engine.generate(prompt, SamplingParams(max_tokens=10), namespace="err")
    monkeypatch.undo()
    assert engine.cache.stats().protected_bytes == 0
    after = engine.generate(prompt, GREEDY, namespace="err")
    assert after.finish_reason in ("stop", "length") and after.cached_tokens > 0


def test_concurrent_requests_match_sequential_when_batch_invariant(loaded_model):
    engine = Engine(
        loaded_model.model,
        loaded_model.tokenizer,
        model_id=loaded_model.model_id,
        config=EngineConfig(model=loaded_model.model_id, batch_invariant=True),
    )
    try:
        assert_concurrent_equals_sequential(engine)
    finally:
        engine.close()


def assert_concurrent_equals_sequential(engine):
    questions = [
        "What is the secret code?",
        "Who leads the team?",
        "When does the team meet?",
        "Where did the project start?",
        "How many members are there?",
        "What does the project study?",
        "In which year did it start?",
        "Summarise the project.",
    ]
    params = SamplingParams(max_tokens=8)  # eight requests: a full batch (max_running) decoding together
    sequential = [engine.generate(_chat(q), params, namespace="seq").text for q in questions]
    results: dict[int, str] = {}

    def worker(i: int) -> None:
        results[i] = engine.generate(_chat(questions[i]), params, namespace="conc").text

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [results[i] for i in range(len(questions))] == sequential
    assert engine.cache.stats().protected_bytes == 0


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "empty"), ([{"role": "user"}], "content"), ([10**9], "out of range"), (3.5, "prompt must be")],
)
def test_bad_prompts(engine, prompt, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt, GREEDY)


def test_too_long_prompt_is_rejected(engine):
    with pytest.raises(ValueError, match="context"):
        engine.generate(list(range(10, 10 + engine.max_context + 5)), GREEDY)


def test_queue_full(loaded_model):
    from engine.request import QueueFullError

    config = EngineConfig(model=loaded_model.model_id, max_waiting=1, max_running=1)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        long = SamplingParams(max_tokens=64, ignore_eos=True)
        streams = [eng.stream("Once upon a time", long)]
        next(streams[0])  # running
        streams.append(eng.stream("Once upon a time", long))  # waiting
        with pytest.raises(QueueFullError) as full:
            eng.stream("Once upon a time", long)
        assert 1.0 <= full.value.retry_after_s <= 60.0
        for s in streams:
            s.close()
    finally:
        eng.close()


def test_closed_engine_refuses(loaded_model):
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    eng.close()
    with pytest.raises(EngineError):
        eng.generate("hi", GREEDY)


def test_closing_a_never_started_stream_cancels_it(engine):
    stream = engine.stream(_chat("Describe the project at length."), SamplingParams(max_tokens=200))
    stream.close()  # before reading a single event
    assert stream.request.done.wait(30)
    assert engine.cache.stats().protected_bytes == 0
    assert engine.stats()["running"] == 0


def test_cancel_from_another_thread(engine):
    stream = engine.stream(
        _chat("Describe the team in detail."), SamplingParams(max_tokens=300, ignore_eos=True)
    )
    next(stream)
    threading.Thread(target=stream.cancel).start()
    events = list(stream)  # ends once the worker has honoured the cancel
    assert events == [] or events[-1].finish_reason == "cancelled"
    assert stream.request.done.wait(30)
    assert engine.cache.stats().protected_bytes == 0


def test_untokenizable_text_is_a_value_error(engine):
    with pytest.raises(ValueError, match="cannot be tokenized"):
        engine.generate("bad \ud800 surrogate", GREEDY)
    with pytest.raises(ValueError, match="cannot be tokenized"):
        engine.generate([{"role": "user", "content": "bad \ud800"}], GREEDY)


def test_per_tenant_cache_stats(engine):
    engine.generate("Tenant stats probe, first.", SamplingParams(max_tokens=2), namespace="stats-a")
    engine.generate("Tenant stats probe, first.", SamplingParams(max_tokens=2), namespace="stats-a")
    a, b = engine.cache_stats("stats-a"), engine.cache_stats("stats-b")
    assert a.hit_tokens > 0 and a.cached_tokens > 0
    assert b.hit_tokens == 0 and b.cached_tokens == 0
    assert engine.cache_stats().cached_tokens >= a.cached_tokens


def test_long_prompt_prefills_in_chunks_with_identical_output(loaded_model, engine_nocache):
    config = EngineConfig(model=loaded_model.model_id, enable_prefix_cache=False, prefill_chunk_tokens=64)
    chunked = Engine(
        loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config
    )
    try:
        prompt = _chat("What is the secret code?")
        assert chunked.generate(prompt, GREEDY).token_ids == engine_nocache.generate(prompt, GREEDY).token_ids
    finally:
        chunked.close()


def test_the_cache_takes_its_policy_parameters_from_the_engine_config(loaded_model):
    config = EngineConfig(
        model=loaded_model.model_id, cache_bytes=1 << 24, eviction="gdsf", gdsf_attention_window=512
    )
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        assert eng.cache.policy.name == "gdsf" and eng.cache.policy.attention_window == 512
        assert eng.cache.capacity_bytes == 1 << 24
    finally:
        eng.close()
