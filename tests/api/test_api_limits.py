"""Back-pressure: a full engine queue and the API's in-flight cap both answer 429 with Retry-After."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from rag.api import Settings
from tests.api.conftest import make_engine
from tests.api.helpers import assert_error, wait_until

STORY = [{"role": "user", "content": "Tell me a long story about a cat who sails around the world."}]


def _stream_body(max_tokens: int = 64) -> dict:
    return {"messages": STORY, "max_tokens": max_tokens, "temperature": 0, "stream": True}


def _first_data(lines) -> str:
    """The first data line. Keep ``lines`` referenced: closing httpx's line iterator closes the
    connection (which the server rightly treats as the client leaving)."""
    for line in lines:
        if line.startswith("data: "):
            return line
    raise AssertionError("stream ended without data")


def _read_first_chunk(url: str) -> None:
    with httpx.stream("POST", url, json=_stream_body(), timeout=60) as reply:
        lines = reply.iter_lines()
        _first_data(lines)


@pytest.fixture(scope="module")
def tight_engine(loaded_model):
    """One decode slot, one queue place."""
    eng = make_engine(loaded_model, max_running=1, max_waiting=1)
    yield eng
    eng.close()


def test_full_engine_queue_is_429_with_retry_after(serve, tight_engine):
    eng = tight_engine
    with serve(Settings(), engine=eng) as srv:
        url = srv.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=_stream_body(), timeout=60) as running:
            running_lines = running.iter_lines()
            _first_data(running_lines)
            # the queued stream's first chunk carries its first token, so it comes once the running
            # one ends: the queued request waits in a thread of its own and leaves after that chunk
            waiting = threading.Thread(target=_read_first_chunk, args=(url,), daemon=True)
            waiting.start()
            assert wait_until(lambda: eng.stats()["waiting"] == 1 and eng.stats()["running"] == 1)
            reply = httpx.post(url, json={"messages": STORY, "max_tokens": 4}, timeout=60)
            err = assert_error(reply, 429, code="queue_full")
            assert err["type"] == "rate_limit_error"
            assert int(reply.headers["retry-after"]) >= 1
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model=eng.model_id, messages=STORY, max_tokens=4)
        waiting.join(60)
        assert not waiting.is_alive()
        assert wait_until(lambda: eng.stats()["running"] == 0 and eng.stats()["waiting"] == 0, timeout=30)
        ok = httpx.post(url, json={"messages": STORY, "max_tokens": 4}, timeout=60)
        assert ok.status_code == 200
        assert 'status="429"' in httpx.get(srv.url + "/metrics").text


def test_api_in_flight_cap(serve, engine):
    with serve(Settings(max_inflight=1, retry_after_s=3), engine=engine) as srv:
        url = srv.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=_stream_body(), timeout=60) as held:
            held_lines = held.iter_lines()
            _first_data(held_lines)
            reply = httpx.post(url, json={"messages": STORY, "max_tokens": 4}, timeout=60)
            assert_error(reply, 429, code="too_many_requests", contains="in flight")
            assert reply.headers["retry-after"] == "3"
            assert httpx.get(srv.url + "/v1/cache").json()["in_flight"] == 1
        assert wait_until(lambda: httpx.get(srv.url + "/v1/cache").json()["in_flight"] == 0, timeout=30)
        assert httpx.post(url, json={"messages": STORY, "max_tokens": 4}, timeout=60).status_code == 200
