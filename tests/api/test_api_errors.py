"""Bad input gets the right 4xx with a clear JSON message in OpenAI's shape; the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from rag.api import Settings
from tests.api.helpers import assert_error

CHAT = "/v1/chat/completions"
OK_CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(
        Settings(max_body_bytes=64 * 1024, max_tokens_limit=64, default_max_tokens=8), engine=engine
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "content", "status", "code", "contains"),
    [
        (CHAT, b'{"messages": [', 400, "invalid_json", "not valid JSON"),
        (CHAT, b"not json at all", 400, "invalid_json", "not valid JSON"),
        (CHAT, b"{}", 422, "missing", "messages"),
        (CHAT, b'{"messages": []}', 422, "too_short", "messages"),
        (CHAT, b'{"messages": "hello"}', 422, None, "messages"),
        (CHAT, b'{"messages": [{"role": "wizard", "content": "hi"}]}', 422, None, "role"),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 5}',
            422,
            None,
            "temperature",
        ),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
            422,
            None,
            "max_tokens",
        ),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 65}',
            400,
            None,
            "limit of 64",
        ),
        (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "n": 3}', 400, None, "n=1"),
        (CHAT, b'{"messages": [{"role": "tool", "content": "x"}]}', 422, None, "messages[0].role"),
        (CHAT, b'{"messages": [{"role": "user"}]}', 422, "missing", "messages[0].content"),
        (CHAT, b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 422, None, "'text'"),
        (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "stop": [""]}', 422, None, "stop[0]"),
        (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "4"}', 422, None, "number"),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": true}',
            422,
            None,
            "number",
        ),
        (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "stream": 1}', 422, None, "boolean"),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5}',
            422,
            None,
            "max_tokens",
        ),
        ("/v1/completions", b'{"prompt": ["a", "b"]}', 400, None, "batched"),
        ("/v1/completions", b'{"prompt": []}', 422, None, "at least 1 item"),
        ("/v1/completions", b'{"prompt": ""}', 422, None, "at least 1 character"),
        ("/v1/completions", b'{"prompt": [99999999]}', 400, None, "out of range"),
        ("/v1/completions", b'{"prompt": "hi", "echo": true}', 400, None, "echo"),
    ],
)
def test_bad_json_bodies(http, path, content, status, code, contains):
    reply = http.post(path, content=content, headers={"content-type": "application/json"})
    err = assert_error(reply, status, code=code, contains=contains)
    assert err["type"] == "invalid_request_error"


def test_hostile_json(http):
    """Lone surrogates (no tokenizer takes them) and very deep nesting: a 4xx, never a 500."""
    lone = b'{"messages": [{"role": "user", "content": "abc \\ud800"}], "max_tokens": 2}'
    assert_error(
        http.post(CHAT, content=lone, headers={"content-type": "application/json"}), 422, contains="unicode"
    )
    deep = b"[" * 20_000 + b"]" * 20_000
    reply = http.post(CHAT, content=deep, headers={"content-type": "application/json"})
    assert_error(reply, 400, code="invalid_json")
    nul = b'{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 2, "temperature": 0}'
    assert http.post(CHAT, content=nul, headers={"content-type": "application/json"}).status_code == 200


def test_json_schema_integers_are_accepted(http):
    """``2.0`` is an integer in JSON Schema (and so for schema-driven clients)."""
    body = {
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 2.0,
        "seed": 3.0,
        "temperature": 0,
    }
    reply = http.post(CHAT, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] <= 2


def test_validation_error_names_the_parameter(http):
    reply = http.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5})
    err = assert_error(reply, 422)
    assert err["param"] == "top_p"


def test_prompt_longer_than_the_context_is_a_400(http, engine):
    words = "lorem ipsum " * (engine.max_context // 2 + 100)
    reply = http.post(CHAT, json={"messages": [{"role": "user", "content": words}], "max_tokens": 4})
    assert_error(reply, 400, contains="context")


def test_unknown_route_and_method(http):
    assert_error(http.get("/v1/nothing-here"), 404, code="route_not_found")
    assert_error(http.get(CHAT), 405, code="method_not_allowed")
    reply = http.put("/v1/documents/some-id")
    assert_error(reply, 405)
    assert reply.headers["allow"] == "DELETE, GET, HEAD"


def test_oversize_body_declared_and_chunked(http):
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (70 * 1024) + b'"}]}'
    assert_error(
        http.post(CHAT, content=big, headers={"content-type": "application/json"}),
        413,
        code="request_too_large",
    )

    def chunks():  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    reply = http.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert_error(reply, 413, code="request_too_large")


def test_server_keeps_serving_after_bad_input(http):
    for _ in range(3):
        http.post(CHAT, content=b"{", headers={"content-type": "application/json"})
    reply = http.post(CHAT, json=OK_CHAT)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
    assert http.get("/healthz").json() == {"status": "ok"}


def test_openapi_documents_the_error_shape(http):
    spec = http.get("/openapi.json").json()
    responses = spec["paths"][CHAT]["post"]["responses"]
    assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "429" in responses and "401" in responses


@pytest.mark.parametrize("status", [400, 401, 404, 422, 429, 500, 502, 503])
def test_raised_and_rendered_errors_agree_on_the_type(status):
    from rag.api.errors import api_error, error_body

    raised = api_error(status, "something went wrong").detail["type"]
    assert raised == error_body(status, "something went wrong")["error"]["type"]
    if status in (500, 502):
        assert raised == "server_error"
