"""bench-router's pure parts: the stream, the oracle, the figures, the report and the CLI (the real
run needs minutes and is what docs/benchmarks/router.md records)."""

from __future__ import annotations

import json
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag.benchmark.router import (
    Outcome,
    RouterBenchConfig,
    configurations,
    plan_stream,
    replay,
    summarize,
)
from rag.benchmark.router_report import results_table, write_plot, write_report
from rag.benchmark.stats import percentile
from rag.benchmark.workload import popularity_order, subject_of
from rag.cli import app
from tests.engine.test_remote import reply, tiny_server

TITLES = {f"t{i}": f"Topic number {i}" for i in range(20)}


def test_the_stream_is_seeded_and_zipf_skewed() -> None:
    cfg = RouterBenchConfig(requests=400, skew=1.2, seed=3)
    plan = plan_stream(cfg, TITLES)
    assert plan == plan_stream(cfg, TITLES)
    assert plan != plan_stream(RouterBenchConfig(requests=400, skew=1.2, seed=4), TITLES)
    counts = Counter(p.topic for p in plan).most_common()
    assert counts[0][1] > 4 * counts[-1][1]  # the most popular topic dominates the least
    flat = Counter(p.topic for p in plan_stream(RouterBenchConfig(requests=400, skew=0.0), TITLES))
    assert max(flat.values()) < 3 * min(flat.values())
    assert all("topic number" in p.question for p in plan)


def test_the_stream_reuses_the_workload_popularity_and_subjects() -> None:
    """One Zipf law, one popularity order, one subject phrasing for both benchmarks."""
    plan = plan_stream(RouterBenchConfig(requests=200, skew=1.2, seed=5), TITLES)
    most_popular = popularity_order(list(TITLES), 5)[0]
    assert Counter(p.topic for p in plan).most_common(1)[0][0] == most_popular
    assert all(subject_of(TITLES[p.topic]) in p.question for p in plan)


def test_summarize_splits_hits_and_misses_and_counts_per_replica() -> None:
    outcomes = [
        Outcome(0, ttft_s=2.0, prompt_tokens=100, cached_tokens=0),
        Outcome(1, ttft_s=0.2, prompt_tokens=100, cached_tokens=90),
        Outcome(2, error="EngineError: boom"),
    ]
    before = [{"engine": {"requests": 1}, "cache": {"hit_tokens": 0, "query_tokens": 10}}, {}]
    after = [
        {"engine": {"requests": 2}, "cache": {"hit_tokens": 90, "query_tokens": 110}},
        {"engine": {"requests": 1}, "cache": {"hit_tokens": 0, "query_tokens": 100}},
    ]
    row = summarize("x", outcomes, 4.0, before, after, replicas=2, policy="cache_aware")
    assert row["token_hit_rate"] == 90 / 200 and row["replica_token_hit_rate"] == 90 / 200
    assert row["ttft_s"]["n"] == 2 and row["ttft_s"]["mean"] == pytest.approx(1.1)
    assert row["hit_ttft_s"]["mean"] == 0.2 and row["miss_ttft_s"]["mean"] == 2.0
    assert row["ttft_s"]["p95"] == percentile([2.0, 0.2], 95)  # the p95 every report computes
    assert [r["requests"] for r in row["per_replica"]] == [1, 1]
    assert row["errors"] == ["EngineError: boom"] and row["requests_per_s"] == 0.5


def test_report_table_and_plot(tmp_path: Path) -> None:
    row = summarize(
        "2 replicas, cache_aware",
        [Outcome(0, 1.0, 1.5, 100, 50)],
        2.0,
        [{}],
        [{"engine": {"requests": 1}, "cache": {"hit_tokens": 50, "query_tokens": 100}}],
        replicas=2,
        policy="cache_aware",
    )
    results: dict[str, Any] = {
        "config": {"skew": 1.2, "seed": 0, "top_k": 4, "concurrency": 3, "max_tokens": 8},
        "stream": {
            "requests": 1,
            "distinct_topics": 1,
            "mean_prompt_tokens": 100,
            "oracle_token_hit_rate": 0.5,
        },
        "configs": [row],
    }
    assert "| 2 replicas, cache_aware | 50.0% | 50.0% | 100% |" in results_table(results)
    write_plot(results, tmp_path / "router.png")
    write_report(results, tmp_path / "router.md")
    assert (tmp_path / "router.png").read_bytes()[:4] == b"\x89PNG"
    assert "router.png" in (tmp_path / "router.md").read_text()


def test_configurations_in_order(tmp_path: Path) -> None:
    cfg = RouterBenchConfig(replicas=(2, 3), policies=("cache_aware", "round_robin"), single_threads=(2, 1))
    names = [name for name, *_ in configurations(cfg, tmp_path)]
    assert names == [
        "1 replica, 2 threads (no router)",
        "1 replica, 1 thread (no router)",
        "2 replicas, cache_aware",
        "2 replicas, round_robin",
        "3 replicas, cache_aware",
        "3 replicas, round_robin",
    ]


def test_replay_sends_every_prompt_as_text_and_keeps_errors() -> None:
    seen: list[str] = []

    def server(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        seen.append(body["prompt"])
        if "boom" in body["prompt"]:
            reply(h, b'{"error": {"message": "boom"}}', 500, "application/json")
            return
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}}
        frames = [
            {"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
        ]
        reply(h, b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames) + b"data: [DONE]\n\n")

    from engine.models import load_tokenizer

    tok = load_tokenizer()
    prompts = [tok.encode(text) for text in ("one", "two", "boom", "four")]
    with tiny_server(server) as url:
        outcomes, wall = replay(url, "m", prompts, concurrency=2, max_tokens=1, tokenizer=tok)
    assert sorted(seen) == ["boom", "four", "one", "two"] and wall > 0
    assert [o.index for o in outcomes] == [0, 1, 2, 3]
    assert "boom" in outcomes[2].error and not outcomes[0].error
    assert (outcomes[0].prompt_tokens, outcomes[0].cached_tokens) == (3, 2)


def test_config_and_cli_validation() -> None:
    with pytest.raises(ValueError, match="policies"):
        RouterBenchConfig(policies=("fastest",))
    with pytest.raises(ValueError, match="concurrency"):
        RouterBenchConfig(concurrency=0)
    runner = CliRunner()
    assert runner.invoke(app, ["bench-router", "--help"]).exit_code == 0
    bad = runner.invoke(app, ["bench-router", "--policies", "fastest", "--out", "/tmp/never"])
    assert bad.exit_code == 2 and "policies" in bad.output
