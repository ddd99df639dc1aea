"""A client that goes away cancels its generation and releases its cache lock (SSE and plain JSON)."""

from __future__ import annotations

import json

import httpx
import pytest

from rag.api import Settings
from tests.api.conftest import make_engine
from tests.api.helpers import wait_until

LONG = [
    {"role": "system", "content": "You are a storyteller. Write long, detailed stories."},
    {"role": "user", "content": "Tell me a very long story about a lighthouse keeper and a storm."},
]


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(Settings(), engine=engine) as srv:
        yield srv


def _idle(engine) -> bool:
    stats = engine.stats()
    return stats["running"] == 0 and stats["waiting"] == 0 and stats["cache"]["protected_bytes"] == 0


def _content_frames(lines, n: int) -> list[dict]:
    """Read SSE lines until ``n`` frames carried text; return those frames."""
    got = []
    for line in lines:
        if line.startswith("data: {"):
            frame = json.loads(line[6:])
            if frame["choices"] and frame["choices"][0]["delta"].get("content"):
                got.append(frame)
                if len(got) == n:
                    break
    return got


def test_disconnect_mid_stream_cancels_and_releases_the_lock(server, engine):
    before = engine.stats()["cancelled"]
    body = {"messages": LONG, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        # Hold the line iterator: a dropped one is closed at once, and httpx then closes the connection.
        lines = reply.iter_lines()
        assert len(_content_frames(lines, 3)) == 3
        running = engine.stats()
        ended = {
            k: running[k] for k in ("running", "waiting", "prefilling", "finished", "cancelled", "failed")
        }
        assert running["running"] == 1, f"{ended}"  # how it ended if not: finished, failed or cancelled
        assert engine.cache.stats().protected_bytes > 0 or engine.stats()["cached_tokens"] == 0
    # the client closed the connection after 3 tokens of 400
    assert wait_until(lambda: _idle(engine), timeout=15), engine.stats()
    stats = engine.stats()
    assert stats["cancelled"] == before + 1
    assert engine.cache.stats().protected_bytes == 0
    assert stats["completion_tokens"] < 400
    metrics = httpx.get(server.url + "/metrics").text
    assert 'prefixrag_client_disconnects_total{endpoint="chat"}' in metrics
    # and the server goes on serving
    ok = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": LONG, "max_tokens": 4, "temperature": 0},
        timeout=60,
    )
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_plain_request_client_timeout_cancels_too(server, engine):
    before = engine.stats()["cancelled"]
    body = {"messages": LONG, "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.5))
    assert wait_until(lambda: _idle(engine) and engine.stats()["cancelled"] == before + 1, timeout=15)
    assert engine.stats()["completion_tokens"] < 400 * 3


def test_disconnect_while_queued_is_released(serve, loaded_model):
    """One decode slot: the second stream waits in the queue; its client leaves before any token."""
    eng = make_engine(loaded_model, max_running=1)
    try:
        with serve(Settings(), engine=eng) as srv:
            url = srv.url + "/v1/chat/completions"
            first = {"messages": LONG, "max_tokens": 24, "temperature": 0, "stream": True}
            second = {"messages": LONG[:1], "max_tokens": 24, "temperature": 0, "stream": True}
            with httpx.stream("POST", url, json=first, timeout=60) as ra:
                lines = ra.iter_lines()
                _content_frames(lines, 1)
                with httpx.stream("POST", url, json=second, timeout=60) as rb:
                    assert rb.status_code == 200
                    assert wait_until(lambda: eng.stats()["waiting"] == 1, timeout=10)
                rest = list(lines)  # the first one finishes normally
                assert "data: [DONE]" in rest
            settled = lambda: _idle(eng) and eng.stats()["cancelled"] + eng.stats()["finished"] == 2  # noqa: E731
            assert wait_until(settled, timeout=30), eng.stats()
            outcome = {k: eng.stats()[k] for k in ("cancelled", "finished", "failed", "requests")}
            assert outcome == {"cancelled": 1, "finished": 1, "failed": 0, "requests": 2}, outcome
    finally:
        eng.close()


def test_many_disconnects_leave_nothing_behind(server, engine):
    url = server.url + "/v1/completions"
    for i in range(5):
        body = {"prompt": f"Story number {i}: once upon a time", "max_tokens": 300, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=60) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    break
    assert wait_until(lambda: _idle(engine), timeout=20), engine.stats()
    assert httpx.get(server.url + "/v1/cache").json()["in_flight"] == 0
