"""The OpenAI-compatible routes through the official openai client and raw HTTP, on a live server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine import SamplingParams
from engine.remote import RemoteEngine
from rag.api import Settings
from tests.api.helpers import assert_error

SYSTEM = (
    "You answer in one short sentence. Facts: the Zorblax project started in 2019 in Lyon; its secret "
    "code is 4417; the team has nine members led by Ada Brennan and meets every Tuesday."
)


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(Settings(), engine=engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_completion_and_cached_tokens_on_repeat(client, engine):
    messages = _messages("Who leads the team?")
    first = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_tokens=12, temperature=0
    )
    second = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_tokens=12, temperature=0
    )
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    assert first.model == engine.model_id
    choice = first.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert 0 < first.usage.completion_tokens <= 12
    # the whole prompt: its KV and the logits the first request saved
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens
    assert second.choices[0].message.content == choice.message.content  # greedy: reuse changes nothing


def test_chat_stream_matches_plain_and_reports_usage(client, engine):
    messages = _messages("In which city did the project start?")
    plain = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_tokens=16, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=engine.model_id,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens_details.cached_tokens > 0  # the plain request cached this prompt
    assert last.usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_wire_format(server, engine):
    body = {"messages": _messages("What is the code?"), "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = reply.read().decode()
    frames = raw.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    payloads = [json.loads(f.removeprefix("data: ")) for f in frames[:-2]]
    assert all(f.startswith("data: ") for f in frames[:-1])
    assert all("usage" not in p for p in payloads)  # without include_usage, no usage key at all
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert set(payloads[0]) >= {"id", "object", "created", "model", "choices"}


def test_plain_response_shape_is_openai(server, engine):
    body = {
        "model": engine.model_id,
        "messages": _messages("How many members?"),
        "max_tokens": 8,
        "temperature": 0,
    }
    data = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert set(data) >= {"id", "object", "created", "model", "choices", "usage"}
    assert set(data["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    assert set(data["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    # stitched_tokens, stitch_deviation: the chunk-reuse extension (a chat prompt has no chunk spans:
    # nothing is stitched)
    details = data["usage"]["prompt_tokens_details"]
    assert details.keys() == {"cached_tokens", "stitched_tokens", "stitch_deviation"}
    assert details["stitched_tokens"] == 0 and details["stitch_deviation"] is None
    assert isinstance(data["created"], int)


def test_max_tokens_stop_and_seed(client, engine):
    messages = _messages("Tell me a long story about Lyon.")
    r = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_completion_tokens=5, temperature=0
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    full = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_tokens=10, temperature=0
    )
    word = full.choices[0].message.content.split()[1]
    cut = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_tokens=10, temperature=0, stop=[word]
    )
    assert word not in cut.choices[0].message.content and cut.choices[0].finish_reason == "stop"
    sampled = [
        client.chat.completions.create(
            model=engine.model_id, messages=messages, max_tokens=8, temperature=0.9, top_p=0.95, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_completions_text_token_ids_and_stream(client, engine):
    r = client.completions.create(
        model=engine.model_id, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert r.object == "text_completion" and r.choices[0].text
    ids = engine.encode("The capital of France is")
    by_ids = client.completions.create(model=engine.model_id, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == r.choices[0].text
    assert by_ids.usage.prompt_tokens_details.cached_tokens == len(ids)  # its logits saved by the first
    chunks = list(
        client.completions.create(
            model=engine.model_id,
            prompt="The capital of France is",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_models(client, server, engine):
    models = client.models.list()
    assert [m.id for m in models.data] == [engine.model_id]
    assert client.models.retrieve(engine.model_id).id == engine.model_id
    assert_error(httpx.get(server.url + "/v1/models/gpt-4"), 404, code="model_not_found")


def test_refusals_are_clear_400s(client, engine):
    messages = _messages("Hi")
    with pytest.raises(openai.BadRequestError, match="n=2"):
        client.chat.completions.create(model=engine.model_id, messages=messages, n=2, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model=engine.model_id, messages=messages, logprobs=True, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.chat.completions.create(
            model=engine.model_id, messages=messages, presence_penalty=0.5, max_tokens=4
        )
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="exceeds"):
        client.chat.completions.create(model=engine.model_id, messages=messages, max_tokens=10**6)


def test_content_parts_and_developer_role(client, engine):
    parts = [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]
    r = client.chat.completions.create(
        model=engine.model_id,
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}],
        max_tokens=8,
        temperature=0,
    )
    assert "Paris" in r.choices[0].message.content


def test_remote_engine_against_the_server(server, engine):
    """engine.RemoteEngine (the Engine interface over HTTP) talks to this server."""
    remote = RemoteEngine(server.url, model=engine.model_id)
    try:
        params = SamplingParams(max_tokens=8, temperature=0)
        messages = _messages("When does the team meet?")
        first = remote.generate(messages, params)
        second = remote.generate(messages, params)
        local = engine.generate(messages, params)
        assert first.text == local.text
        assert second.cached_tokens > 0 and second.prompt_tokens == first.prompt_tokens
        salted = remote.generate(messages, params, namespace="fresh-session")  # cache_salt: own namespace
        assert salted.cached_tokens == 0
        assert remote.stats()["object"] == "cache.stats"
    finally:
        remote.close()


def test_multi_turn_reuses_the_previous_turn(client, engine):
    """Messages are tokenized one by one, so turn 2's prompt starts with turn 1's ids (and its reply)."""
    turn1 = _messages("What is the secret code?")
    r1 = client.chat.completions.create(model=engine.model_id, messages=turn1, max_tokens=10, temperature=0)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "And who leads the team?"},
    ]
    r2 = client.chat.completions.create(model=engine.model_id, messages=turn2, max_tokens=6, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
