"""The KV tiers over HTTP and the CLI: bytes per token and per-tier figures in /v1/cache and /metrics,
warming through POST /v1/cache/warm (admin key) and `prefixrag cache warm`."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from rag.api import Settings
from rag.cli import app
from tests.api.conftest import make_engine
from tests.api.helpers import assert_error, metric_value

KEY, ADMIN = "sk-tenant-kv-001", "sk-admin-kv-0001"
SYSTEM = [{"role": "system", "content": "You answer questions about the Ghent bakery's opening hours. " * 12}]


@pytest.fixture(scope="module")
def tiered(loaded_model, tmp_path_factory):
    eng = make_engine(loaded_model, kv_dtype="int8", disk_cache_dir=tmp_path_factory.mktemp("kv"))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(serve, tiered):
    with serve(Settings(api_keys={KEY: "alice"}, admin_key=ADMIN), engine=tiered) as srv:
        yield srv


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_cache_stats_show_the_format_and_both_tiers(server):
    body = httpx.get(server.url + "/v1/cache", headers=_auth(KEY)).json()
    assert body["kv"] == {"kv_dtype": "int8", "bytes_per_token": 11_880}
    disk = body["disk"]
    assert disk["capacity_bytes"] == 8 << 30 and {"hit_tokens", "read_s", "write_s", "evictions"} <= set(disk)


def test_warm_needs_the_admin_key_and_fills_the_tenant_cache(server, tiered):
    url = server.url + "/v1/cache/warm"
    body = {"prompts": [SYSTEM, "Opening hours: seven to six."], "tenant": "alice"}
    assert_error(httpx.post(url, json=body, headers=_auth(KEY)), 403, code="admin_required")
    assert httpx.post(url, json=body).status_code == 401
    reply = httpx.post(url, json=body, headers=_auth(ADMIN), timeout=120)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["object"] == "cache.warm" and out["prompts"] == 2 and out["disk_written"] is True
    assert out["prompt_tokens"] > 128
    assert tiered.stats()["disk"]["written_blocks"] >= 2
    chat = {"messages": [*SYSTEM, {"role": "user", "content": "When do you open?"}], "max_tokens": 2}
    reply = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=_auth(KEY), timeout=120)
    assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 128  # the warmed system prompt


@pytest.mark.parametrize(
    "body",
    [
        {"prompts": []},
        {"prompts": [""]},
        {"prompts": ["hi"], "tenant": "bad\u0001tenant"},
        {"prompts": [[]]},
        {},
    ],
)
def test_warm_rejects_bad_bodies(server, body):
    reply = httpx.post(server.url + "/v1/cache/warm", json=body, headers=_auth(ADMIN))
    assert reply.status_code == 422, reply.text


def test_warm_rejects_a_prompt_past_the_context(server):
    body = {"prompts": ["word " * 9000]}
    assert_error(httpx.post(server.url + "/v1/cache/warm", json=body, headers=_auth(ADMIN), timeout=60), 400)


def test_metrics_show_bytes_per_token_and_tiers(server):
    text = httpx.get(server.url + "/metrics").text
    assert metric_value(text, "prefixrag_kv_bytes_per_token") == 11_880
    assert metric_value(text, "prefixrag_kv_tier_hit_tokens_total", tier="ram") >= 0
    assert metric_value(text, "prefixrag_kv_tier_hit_tokens_total", tier="disk") >= 0
    assert metric_value(text, "prefixrag_kv_disk_capacity_bytes") == 8 << 30
    assert metric_value(text, "prefixrag_kv_disk_written_blocks_total") >= 0


def test_serve_turns_the_disk_tier_on_under_prefixrag_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path))
    on = Settings(engine={"disk_cache_bytes": 1 << 30}).with_disk_cache_default()
    assert on.engine.disk_cache_dir == tmp_path / "kv"
    off = Settings(engine={"disk_cache_bytes": 0}).with_disk_cache_default()
    assert off.engine.disk_cache_dir is None
    chosen = Settings(engine={"disk_cache_dir": str(tmp_path / "x")}).with_disk_cache_default()
    assert chosen.engine.disk_cache_dir == tmp_path / "x"


def test_cli_cache_warm(monkeypatch, tmp_path):
    folder = tmp_path / "kv"
    monkeypatch.setenv("PREFIXRAG_ENGINE__DISK_CACHE_DIR", str(folder))
    monkeypatch.setenv("PREFIXRAG_ENGINE__DISK_CACHE_BYTES", str(1 << 30))
    prompts = tmp_path / "faq.json"
    prompts.write_text(json.dumps([SYSTEM, "Which loaves are sold on Sundays? " * 10]))
    result = CliRunner().invoke(
        app, ["cache", "warm", "One more prompt.", "--file", str(prompts), "--tenant", "t"]
    )
    assert result.exit_code == 0, result.output
    assert "warmed 3 prompts" in result.output and str(folder) in result.output
    assert len(list(folder.rglob("*.kvb"))) >= 2

    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    result = CliRunner().invoke(app, ["cache", "warm", "--file", str(bad)])
    assert result.exit_code == 2 and "JSON list" in result.output
    result = CliRunner().invoke(app, ["cache", "warm"])
    assert result.exit_code == 2 and "no prompts" in result.output
