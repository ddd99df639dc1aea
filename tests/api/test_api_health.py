"""Liveness and readiness while the model loads (a real engine, built behind a gate), and after."""

from __future__ import annotations

import threading

import httpx

from rag.api import Settings
from tests.api.conftest import make_engine
from tests.api.helpers import assert_error, wait_until


def test_ready_only_once_the_model_is_loaded(serve, loaded_model):
    gate = threading.Event()

    def build():
        assert gate.wait(60), "test gate never opened"
        return make_engine(loaded_model)

    with serve(Settings(), engine_factory=build) as srv:
        assert httpx.get(srv.url + "/healthz").json() == {"status": "ok"}
        probe = httpx.get(srv.url + "/health")  # what a load balancer probes: not ready yet
        assert probe.status_code == 503 and probe.json() == {"status": "loading"}
        loading = httpx.get(srv.url + "/readyz")
        assert loading.status_code == 503 and loading.json()["status"] == "loading"
        assert httpx.get(srv.url + "/server_info").json()["prefix_caching"] is None  # not decided yet
        reply = httpx.post(
            srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert_error(reply, 503, code="not_ready", contains="loading")
        assert int(reply.headers["retry-after"]) > 0
        assert "prefixrag_model_ready 0.0" in httpx.get(srv.url + "/metrics").text
        gate.set()
        assert wait_until(lambda: httpx.get(srv.url + "/readyz").status_code == 200, timeout=60)
        ready = httpx.get(srv.url + "/readyz").json()
        assert ready["status"] == "ready" and ready["model"] == loaded_model.model_id
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        assert httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_failed_load_is_reported(serve):
    def broken():
        raise FileNotFoundError("no model at /nowhere")

    with serve(Settings(), engine_factory=broken) as srv:
        assert wait_until(lambda: httpx.get(srv.url + "/readyz").json()["status"] == "failed", timeout=10)
        body = httpx.get(srv.url + "/readyz").json()
        assert "no model at /nowhere" in body["error"]
        assert httpx.get(srv.url + "/healthz").status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 503
        reply = httpx.get(srv.url + "/v1/models")
        assert_error(reply, 503, contains="failed to load")
