"""/metrics: Prometheus text whose counters move as requests are served; one registry per app."""

from __future__ import annotations

import httpx
import pytest

from rag.api import Settings, create_app
from tests.api.helpers import metric_value

PROMPT = [
    {
        "role": "system",
        "content": "You are a concise assistant for a bakery in Ghent that opens at seven. "
        "It sells sourdough, rye, spelt and seeded loaves, croissants, pain au chocolat, cinnamon rolls, "
        "fruit tarts and speculoos. It closes at six on weekdays, at two on Saturdays, and all of Sunday. "
        "Orders for more than ten loaves need a day's notice; payment is by card or cash.",
    },
    {"role": "user", "content": "When does the bakery open?"},
]


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(Settings(), engine=engine) as srv:
        yield srv


def _scrape(server) -> str:
    reply = httpx.get(server.url + "/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return reply.text


def test_counters_move(server):
    before = _scrape(server)
    chat = {"messages": PROMPT, "max_tokens": 6, "temperature": 0}
    for _ in range(2):
        assert httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
    httpx.post(server.url + "/v1/chat/completions", json={"messages": []})  # a 422
    after = _scrape(server)

    def delta(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    route = "/v1/chat/completions"
    assert delta("prefixrag_http_requests_total", route=route, status="200", method="POST") == 2
    assert delta("prefixrag_http_requests_total", route=route, status="422") == 1
    assert delta("prefixrag_http_request_duration_seconds_count", route=route) == 3
    assert delta("prefixrag_time_to_first_token_seconds_count", endpoint="chat") == 2
    assert delta("prefixrag_e2e_request_latency_seconds_count", endpoint="chat") == 2
    assert delta("prefixrag_prompt_tokens_total", endpoint="chat") > 0
    assert delta("prefixrag_cached_prompt_tokens_total", endpoint="chat") > 0  # the repeat hit
    assert delta("prefixrag_generation_tokens_total", endpoint="chat") > 0
    assert delta("prefixrag_prefix_cache_queries_total") > 0
    assert delta("prefixrag_prefix_cache_hits_total") > 0
    assert delta("prefixrag_engine_requests_total", outcome="finished") == 2
    assert metric_value(after, "prefixrag_prefix_cache_used_bytes") > 0
    assert metric_value(after, "prefixrag_kv_slab_bytes") > 0  # the prompt's whole 64-token blocks
    assert metric_value(after, "prefixrag_prefix_cache_capacity_bytes") > 0
    assert metric_value(after, "prefixrag_model_ready") == 1
    for name in (
        "prefixrag_engine_queue_depth",
        "prefixrag_engine_running",
        "prefixrag_prefix_cache_evictions_total",
        "prefixrag_api_requests_in_flight",
    ):
        assert name in after


def test_unknown_paths_share_one_label(server):
    for path in ("/a", "/b/c", "/v1/zzz"):
        httpx.get(server.url + path)
    text = _scrape(server)
    assert metric_value(text, "prefixrag_http_requests_total", route="unmatched", status="404") >= 3
    assert 'route="/a"' not in text


def test_each_app_has_its_own_registry(engine):
    one, two = create_app(Settings(), engine=engine), create_app(Settings(), engine=engine)
    m1, m2 = one.state.services.metrics, two.state.services.metrics
    m1.requests.labels("/x", "GET", "200").inc()
    assert metric_value(m1.render().decode(), "prefixrag_http_requests_total", route="/x") == 1
    assert metric_value(m2.render().decode(), "prefixrag_http_requests_total", route="/x") == 0
