"""Streaming as benchmark tools read it (vLLM's client, genai-perf, guidellm): the first SSE chunk is
the first token, ``ignore_eos`` runs to exactly ``max_tokens``, ``include_usage`` ends with a usage
chunk whose ``choices`` are empty. Through the official openai client against a live server."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from rag.api import Settings

# a prompt long enough that its prefill takes far longer than sending a frame
CONTEXT = " ".join(
    f"Item {i} of the inventory is a {['red', 'blue', 'green'][i % 3]} box." for i in range(90)
)
SHORT_ANSWER = [{"role": "user", "content": "Reply with the single word: yes."}]


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(Settings(), engine=engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _timed_first_chunk(start: float, stream: Any) -> tuple[float, Any, list[Any]]:
    """Seconds from the request (sent at ``start``) to its first chunk, that chunk, and the rest."""
    iterator = iter(stream)
    first = next(iterator)
    elapsed = time.perf_counter() - start
    return elapsed, first, list(iterator)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_first_chunk_is_the_first_token(client, engine, route):
    """The first chunk cannot leave before the prompt's prefill ends, and it carries the first
    token's text (the chat role rides with it). A fresh cache salt makes the prefill cold."""
    before = engine.stats()["prefill_s"]
    salt = f"first-chunk-{route}"
    start = time.perf_counter()  # before the request: its prefill may begin before create() returns
    if route == "chat":
        messages = [{"role": "user", "content": CONTEXT + "\nWhich colour is item 7?"}]
        stream = client.chat.completions.create(
            model=engine.model_id,
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"cache_salt": salt},
        )
        elapsed, first, rest = _timed_first_chunk(start, stream)
        assert first.choices[0].delta.role == "assistant"
        assert first.choices[0].delta.content  # the first token's text, not an empty role delta
        assert all(c.choices[0].delta.role is None for c in rest)
    else:
        stream = client.completions.create(
            model=engine.model_id,
            prompt=CONTEXT + "\nItem 7 is a",
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"cache_salt": salt},
        )
        elapsed, first, rest = _timed_first_chunk(start, stream)
        assert first.choices[0].text
    prefill_s = engine.stats()["prefill_s"] - before
    assert prefill_s > 0.0
    assert elapsed >= prefill_s  # causal: the first chunk was sent after the prefill, not before
    assert rest[-1].choices[0].finish_reason in ("stop", "length")


def test_ignore_eos_gives_exactly_max_tokens_on_both_routes(client, engine):
    plain = client.chat.completions.create(
        model=engine.model_id, messages=SHORT_ANSWER, max_tokens=40, temperature=0
    )
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 40  # EOS early
    chat = client.chat.completions.create(
        model=engine.model_id,
        messages=SHORT_ANSWER,
        max_tokens=40,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.usage.completion_tokens == 40 and chat.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(
            model=engine.model_id,
            prompt="Yes.",
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 40


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_include_usage_ends_with_a_usage_chunk(client, engine, route):
    common: dict[str, Any] = {
        "model": engine.model_id,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {"ignore_eos": True},
    }
    if route == "chat":
        chunks = list(client.chat.completions.create(messages=SHORT_ANSWER, **common))
    else:
        chunks = list(client.completions.create(prompt="Once upon a time", **common))
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 12
    assert last.usage.total_tokens == last.usage.prompt_tokens + 12
    assert all(c.usage is None and c.choices for c in body)
    finishes = [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason]
    assert finishes == ["length"]
