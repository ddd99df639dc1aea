"""What sglang-router asks a worker: /health, SGLang's model and server info routes, X-Request-Id."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from engine import EngineConfig
from rag.api import Settings
from rag.api.request_id import clean_request_id
from tests.api.helpers import wait_until


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(Settings(api_keys={"sk-alice-123": "alice"}, max_inflight=7), engine=engine) as srv:
        yield srv


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info_names_the_model_without_a_tokenizer_path(server, engine, path):
    info = httpx.get(server.url + path).json()  # no key needed, like /health
    assert info["served_model_name"] == engine.model_id and info["is_generation"] is True
    assert info["max_context_length"] == engine.max_context
    assert "model_path" not in info and "tokenizer_path" not in info  # the router would fetch it


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_server_info_states_the_limits(server, engine, path):
    info = httpx.get(server.url + path).json()
    assert info["served_model_name"] == engine.model_id
    assert info["state"] == "ready" and info["dp_size"] == 1 and info["max_running_requests"] == 7
    assert info["prefix_caching"] is True and info["cache_bytes"] == engine.config.cache_bytes
    assert "model_path" not in info
    # the engine's own verdict on reuse exactness for this machine, with its reason
    assert info["exact_reuse"] == engine.stats()["exact_reuse"] and isinstance(info["exact_reuse"], bool)
    assert info["exact_reuse_reason"] == engine.stats()["exact_reuse_reason"]


def test_cache_stats_state_the_exact_reuse_verdict(server, engine):
    body = httpx.get(server.url + "/v1/cache", headers={"Authorization": "Bearer sk-alice-123"}).json()
    assert body["exact_reuse"] == engine.stats()["exact_reuse"]
    assert "prompt" in body["exact_reuse_reason"]


def test_server_info_reports_caching_as_the_engine_decided(serve, loaded_model, tmp_path):
    """The settings ask for prefix caching; a model with sliding-window attention makes the engine turn
    it off (its KV cannot be reused exactly), and /server_info reports the engine's decision."""
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(loaded_model.tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=16,
        max_position_embeddings=256,
    )
    MistralForCausalLM(config).save_pretrained(tmp_path)  # a tiny random model: no such checkpoint here
    loaded_model.tokenizer.save_pretrained(tmp_path)
    settings = Settings(engine=EngineConfig(model=str(tmp_path)))
    assert settings.engine.enable_prefix_cache and settings.engine.cache_bytes > 0
    with serve(settings) as server:
        ready = lambda: httpx.get(server.url + "/readyz").status_code == 200  # noqa: E731
        assert wait_until(ready, timeout=120, interval=0.2), httpx.get(server.url + "/readyz").text
        info = httpx.get(server.url + "/server_info").json()
    assert info["prefix_caching"] is False


def test_health_is_ok_once_ready(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_request_ids_are_echoed_or_made(server):
    given = httpx.get(server.url + "/healthz", headers={"X-Request-Id": "client-7:abc"})
    assert given.headers["x-request-id"] == "client-7:abc"
    made = httpx.get(server.url + "/healthz").headers["x-request-id"]
    assert len(made) == 32 and made != httpx.get(server.url + "/healthz").headers["x-request-id"]
    unusable = httpx.get(server.url + "/healthz", headers={"X-Request-Id": "two words"})
    assert unusable.headers["x-request-id"] != "two words"
    trace = httpx.get(server.url + "/healthz", headers={"X-Correlation-Id": "corr-1"})
    assert trace.headers["x-request-id"] == "corr-1"


def test_errors_carry_the_request_id_too(server):
    denied = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "denied-1"})
    assert denied.status_code == 401 and denied.headers["x-request-id"] == "denied-1"


def test_clean_request_id():
    assert clean_request_id("a" * 128) == "a" * 128
    assert clean_request_id("a" * 129) is None
    assert (
        clean_request_id("") is None and clean_request_id("x\ny") is None and clean_request_id("x\n") is None
    )
