"""The Redis tier when Redis fails: killed mid-run under HTTP traffic (no failed request, outputs equal
to caching off's, then a restart it reconnects to by itself), slow (a bounded wait, then nothing per
request while it is skipped), and down before the engine starts. Each test runs a redis-server of
its own on 127.0.0.1; greedy outputs are compared with the same engine's cold output."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import httpx

from engine import Engine, EngineConfig, SamplingParams
from rag.api import Settings
from rag.benchmark.redis_server import free_port
from tests.api.helpers import metric_value, wait_until
from tests.engine.reuse_helpers import real_text_ids

TIMEOUT_S = 0.25
LOGGER = "engine.tiers.redis_tier"
GREEDY = SamplingParams(max_tokens=2, ignore_eos=True)


def _engine(loaded, url: str) -> Engine:
    config = EngineConfig(remote_cache_url=url, remote_cache_timeout_s=TIMEOUT_S)
    return Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=config)


def _prompts(loaded, n: int) -> list[list[int]]:
    ids = real_text_ids(loaded.tokenizer, 130 + n)
    return [ids[i : i + 130] for i in range(n)]  # two blocks and 2 tokens each, distinct from the first on


def _complete(http: httpx.Client, prompt: list[int], salt: str | None = None) -> tuple[str, int]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    if salt:
        body["cache_salt"] = salt  # another namespace: nothing cached, computed as with caching off
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 200, (reply.status_code, reply.text)
    out = reply.json()
    return out["choices"][0]["text"], out["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_redis_killed_mid_run_fails_no_request_and_is_reconnected(serve, loaded_model, redis_factory, caplog):
    redis = redis_factory()
    eng = _engine(loaded_model, redis.url())
    prompts = _prompts(loaded_model, 3)
    try:
        with (
            serve(Settings(), engine=eng) as srv,
            httpx.Client(base_url=srv.url, timeout=120) as http,
            caplog.at_level(logging.WARNING, logger=LOGGER),
        ):
            cold = [_complete(http, p, salt=f"cold-{uuid.uuid4().hex}")[0] for p in prompts]
            for p in prompts:
                _complete(http, p)
            assert eng.tiers.flush(60)
            eng.reset_cache()  # RAM forgets: the next round reads Redis
            results: list[tuple[str, int]] = []

            def traffic() -> None:
                for p in prompts * 2:
                    results.append(_complete(http, p))
                    time.sleep(0.05)

            runner = threading.Thread(target=traffic)
            runner.start()
            assert wait_until(lambda: len(results) >= 2, timeout=120, interval=0.01)
            redis.kill()  # mid-run: reads and writes in flight fail
            runner.join(300)
            assert [text for text, _ in results] == cold * 2  # every request answered, as computed cold
            assert results[0][1] == len(prompts[0]) - 1  # before the kill: from Redis
            remote = http.get("/v1/cache").json()["remote"]
            assert remote["available"] == 0 and remote["outages"] == 1 and remote["unavailable"] >= 1
            assert eng.stats()["failed"] == 0

            redis.start()  # same port, empty (no persistence)
            assert wait_until(lambda: eng.stats()["remote"]["available"] == 1, timeout=60)
            eng.reset_cache()
            assert _complete(http, prompts[0])[1] == 0  # Redis restarted empty
            assert eng.tiers.flush(60)
            eng.reset_cache()
            assert _complete(http, prompts[0]) == (cold[0], len(prompts[0]) - 1)  # written and read again
            metrics = http.get("/metrics").text
            assert metric_value(metrics, "prefixrag_kv_remote_outages_total") == 1
            assert metric_value(metrics, "prefixrag_kv_remote_available") == 1
            assert metric_value(metrics, "prefixrag_kv_tier_hit_tokens_total", tier="remote") > 0
        messages = [rec.message for rec in caplog.records]
        assert sum("unreachable" in m for m in messages) == 1, messages  # one line per outage
        assert any("answers again" in m for m in messages), messages
    finally:
        eng.close()


def test_a_slow_redis_costs_one_bounded_wait_then_nothing(loaded_model, redis_factory):
    redis = redis_factory()
    eng = _engine(loaded_model, redis.url())
    off = Engine(
        loaded_model.model,
        loaded_model.tokenizer,
        model_id=loaded_model.model_id,
        config=EngineConfig(enable_prefix_cache=False),
    )
    first, second = _prompts(loaded_model, 2)
    try:
        eng.generate(first, GREEDY)
        assert eng.tiers.flush(60)
        eng.reset_cache()
        sleeper = redis.client()
        stall = threading.Thread(target=lambda: sleeper.execute_command("DEBUG", "SLEEP", "4"), daemon=True)
        stall.start()
        time.sleep(0.2)  # the server is asleep: it accepts connections and answers nothing
        slow = eng.generate(first, GREEDY)
        skipped = eng.generate(second, GREEDY)
        assert slow.cached_tokens == 0 and slow.token_ids == off.generate(first, GREEDY).token_ids
        assert slow.phases["tiers"] < 4 * TIMEOUT_S  # one timed-out lookup, not the 4 s stall
        assert skipped.phases["tiers"] < 0.1  # the breaker is open: requests do not ask Redis at all
        assert skipped.token_ids == off.generate(second, GREEDY).token_ids
        stall.join(30)
        sleeper.close()
        assert wait_until(lambda: eng.stats()["remote"]["available"] == 1, timeout=60)
        eng.reset_cache()
        assert eng.generate(first, GREEDY).cached_tokens == len(first) - 1  # awake again: read as before
    finally:
        eng.close()
        off.close()


def test_an_engine_starts_and_serves_with_redis_down(loaded_model, redis_factory):
    port = free_port()
    started = time.monotonic()
    eng = _engine(loaded_model, f"redis://127.0.0.1:{port}/0")  # nothing listens there yet
    try:
        assert time.monotonic() - started < 5
        prompt = _prompts(loaded_model, 1)[0]
        assert eng.generate(prompt, GREEDY).token_ids
        remote = eng.stats()["remote"]
        assert remote["available"] == 0 and remote["outages"] == 1
        redis_factory(port=port)  # it comes up: the engine finds it by itself
        assert wait_until(lambda: eng.stats()["remote"]["available"] == 1, timeout=60)
        eng.generate(prompt, GREEDY)
        assert eng.tiers.flush(60) and eng.stats()["remote"]["written_blocks"] >= 2
    finally:
        eng.close()
