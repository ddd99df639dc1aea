"""API keys, tenants as cache namespaces, the admin key."""

from __future__ import annotations

import hmac

import httpx
import openai
import pytest

from rag.api import Settings
from rag.api.auth import KeyRing, Principal, bearer_token
from tests.api.helpers import assert_error

KEY_A, KEY_B, ADMIN = "sk-tenant-a-0001", "sk-tenant-b-0002", "sk-admin-0000001"
PROMPT = [
    {
        "role": "system",
        "content": "You are a terse assistant for the Zorblax project, founded in Lyon in 2019.",
    },
    {"role": "user", "content": "Where was the project founded?"},
]


@pytest.fixture(scope="module")
def server(serve, engine):
    settings = Settings(api_keys={KEY_A: "alice", KEY_B: "bob"}, admin_key=ADMIN)
    with serve(settings, engine=engine) as srv:
        yield srv


def _chat(server, key: str | None, messages=PROMPT, **extra) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def _cached(reply: httpx.Response) -> int:
    assert reply.status_code == 200, reply.text
    return int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_missing_or_wrong_key_is_401(server):
    for headers in ({}, {"Authorization": "Bearer sk-wrong-key-123"}, {"Authorization": "Basic abc"}):
        reply = httpx.post(server.url + "/v1/chat/completions", json={"messages": PROMPT}, headers=headers)
        assert_error(reply, 401, code="invalid_api_key")
        assert reply.headers["www-authenticate"] == "Bearer"
    for path in ("/v1/models", "/v1/cache", "/v1/ask", "/v1/documents"):
        method = "POST" if path == "/v1/ask" else "GET"
        reply = httpx.request(method, server.url + path, json={"question": "q"} if method == "POST" else None)
        assert_error(reply, 401)


def test_openai_client_with_wrong_key(server, engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=engine.model_id, messages=PROMPT, max_tokens=4)
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)
    assert good.models.list().data[0].id == engine.model_id


def test_probes_need_no_key(server):
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.get(server.url + "/readyz").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_tenant_isolation(server):
    """B's first request with A's exact prompt reuses nothing; each tenant reuses its own prefix."""
    assert _cached(_chat(server, KEY_A)) == 0
    assert _cached(_chat(server, KEY_A)) > 0
    assert _cached(_chat(server, KEY_B)) == 0
    assert _cached(_chat(server, KEY_B)) > 0


def test_cache_salt_subdivides_a_tenant_but_never_reaches_another(server):
    messages = [{"role": "user", "content": "Salted prompt about the Lyon office, please."}]
    assert _cached(_chat(server, KEY_A, messages, cache_salt="s1")) == 0
    assert _cached(_chat(server, KEY_A, messages, cache_salt="s1")) > 0
    assert _cached(_chat(server, KEY_A, messages, cache_salt="s2")) == 0
    # B naming A's salt stays inside B's namespace
    assert _cached(_chat(server, KEY_B, messages, cache_salt="s1")) == 0


def test_cache_reset_needs_the_admin_key(server):
    url = server.url + "/v1/cache/reset"
    assert_error(httpx.post(url), 401)
    assert_error(httpx.post(url, headers={"Authorization": f"Bearer {KEY_A}"}), 403, code="admin_required")
    _chat(server, KEY_A)
    assert _cached(_chat(server, KEY_A)) > 0
    reply = httpx.post(url, headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 200 and reply.json()["used_bytes"] == 0
    assert _cached(_chat(server, KEY_A)) == 0  # the reset dropped A's prefix
    stats = httpx.get(server.url + "/v1/cache", headers={"Authorization": f"Bearer {KEY_B}"}).json()
    assert stats["cache"]["query_tokens"] > 0  # counters survive the reset


def test_admin_key_without_tenant_keys(serve, engine):
    """No tenant keys: everyone is the anonymous tenant (a placeholder key is ignored); the admin
    key still guards the reset."""
    with serve(Settings(admin_key=ADMIN), engine=engine) as srv:
        assert _chat(srv, None).status_code == 200
        assert _chat(srv, "EMPTY").status_code == 200
        assert_error(httpx.post(srv.url + "/v1/cache/reset"), 403)
        ok = httpx.post(srv.url + "/v1/cache/reset", headers={"Authorization": f"Bearer {ADMIN}"})
        assert ok.status_code == 200


def test_keyring_compares_every_key(monkeypatch):
    """Constant time: every configured key is compared, even after a match; digests hide lengths."""
    ring = KeyRing({KEY_A: "alice", KEY_B: "bob", "sk-third-key-3": "carol"}, admin_key=ADMIN)
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert ring.lookup(KEY_A) == Principal("alice")
    assert len(calls) == 4 and all(pair == (32, 32) for pair in calls)
    calls.clear()
    assert ring.lookup("x") is None and len(calls) == 4
    assert ring.lookup(ADMIN) == Principal("admin", admin=True)
    assert ring.lookup("") is None and ring.lookup(None) is None


def test_bearer_parsing_and_namespaces():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert (
        bearer_token("Basic abc") is None and bearer_token("Bearer ") is None and bearer_token(None) is None
    )
    assert Principal("a").namespace() == "a"
    assert Principal("a").namespace("b") not in (Principal("a").namespace(), Principal("b").namespace())


def test_settings_reject_bad_keys_and_tenants():
    with pytest.raises(ValueError, match="8 characters"):
        Settings(api_keys={"short": "alice"})
    with pytest.raises(ValueError, match="tenant"):
        Settings(api_keys={"sk-long-enough": "bad tenant\x1e"})
    with pytest.raises(ValueError, match="differ"):
        Settings(api_keys={ADMIN: "alice"}, admin_key=ADMIN)


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("PREFIXRAG_API_KEYS", '{"sk-from-env-01": "envtenant"}')
    monkeypatch.setenv("PREFIXRAG_ADMIN_KEY", "sk-admin-from-env")
    monkeypatch.setenv("PREFIXRAG_ENGINE__CACHE_BYTES", "1048576")
    monkeypatch.setenv("PREFIXRAG_MAX_INFLIGHT", "3")
    s = Settings()
    assert s.api_keys == {"sk-from-env-01": "envtenant"} and s.auth_enabled
    assert s.admin_key is not None and s.admin_key.get_secret_value() == "sk-admin-from-env"
    assert s.engine.cache_bytes == 1 << 20 and s.max_inflight == 3
    assert "sk-admin-from-env" not in repr(s)
