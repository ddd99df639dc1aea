"""Markdown table and plot for `prefixrag bench-router` results (``rag.benchmark.router``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def results_table(results: dict[str, Any]) -> str:
    """One markdown row per configuration: hit rates, TTFT, where the requests went.

    >>> row = {"name": "1 replica", "token_hit_rate": 0.5, "replica_token_hit_rate": 0.5,
    ...        "ttft_s": {"mean": 1.0, "p50": 0.5, "p95": 3.0}, "hit_ttft_s": {"mean": 0.4, "n": 2},
    ...        "miss_ttft_s": {"mean": 2.0, "n": 2}, "requests_per_s": 0.5, "errors": [],
    ...        "per_replica": [{"requests": 4, "evicted_tokens": 0}]}
    >>> print(results_table({"configs": [row], "stream": {"oracle_token_hit_rate": 0.6}}).splitlines()[2])
    | 1 replica | 50.0% | 50.0% | 83% | 1.00 | 0.50 | 3.00 | 0.40 (2) | 2.00 (2) | 4 | 0 | 0.50 |
    """
    oracle = results["stream"]["oracle_token_hit_rate"]
    lines = [
        "| configuration | token hit rate | (replicas' counters) | of oracle | TTFT mean s | p50 s | p95 s "
        "| TTFT hits s (n) | TTFT misses s (n) | requests per replica | evicted tokens | req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results["configs"]:
        t, h, m = r["ttft_s"], r["hit_ttft_s"], r["miss_ttft_s"]
        spread = " / ".join(str(p["requests"]) for p in r["per_replica"])
        of_oracle = f"{100 * r['token_hit_rate'] / oracle:.0f}%" if oracle else "-"
        lines.append(
            f"| {r['name']} | {100 * r['token_hit_rate']:.1f}% | {100 * r['replica_token_hit_rate']:.1f}% "
            f"| {of_oracle} | {_s(t['mean'])} | {_s(t['p50'])} | {_s(t['p95'])} "
            f"| {_s(h['mean'])} ({h['n']}) | {_s(m['mean'])} ({m['n']}) | {spread} "
            f"| {sum(p.get('evicted_tokens', 0) for p in r['per_replica'])} | {r['requests_per_s']:.2f} |"
        )
    return "\n".join(lines)


def _s(seconds: float | None) -> str:
    """Seconds with two decimals; '-' when there was no request to measure (NaN, or null in JSON)."""
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds:.2f}"


def write_plot(results: dict[str, Any], path: Path) -> None:
    """Token hit rate (top) and TTFT (mean with p50 and p95 marks, bottom) per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["configs"]
    names = [r["name"].replace(", ", "\n").replace(" (", "\n(") for r in rows]
    fig, (left, right) = plt.subplots(2, 1, figsize=(max(8.0, 1.5 * len(rows)), 7.5), sharex=True)
    x = range(len(rows))
    left.bar(x, [100 * r["token_hit_rate"] for r in rows], color="#4c72b0")
    left.axhline(100 * results["stream"]["oracle_token_hit_rate"], color="k", ls="--", lw=1, label="oracle")
    left.set_ylabel("token hit rate (%)")
    left.set_ylim(0, 100)
    left.legend(loc="lower right")
    right.bar(x, [r["ttft_s"]["mean"] for r in rows], color="#dd8452", label="mean")
    right.scatter(x, [r["ttft_s"]["p50"] for r in rows], color="k", marker="_", s=400, label="p50", zorder=3)
    right.scatter(x, [r["ttft_s"]["p95"] for r in rows], color="k", marker="^", label="p95", zorder=3)
    right.set_xticks(list(x), names)
    right.set_ylabel("TTFT (s, client side)")
    right.legend()
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("RAG workload: one replica vs replicas behind sglang-router (all on one 2-core host)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict[str, Any], path: Path) -> None:
    """The figures as markdown (the committed report adds the discussion around them)."""
    stream, cfg = results["stream"], results["config"]
    text = (
        f"Stream: {stream['requests']} requests, {stream['distinct_topics']} distinct topics, "
        f"Zipf skew {cfg['skew']}, seed {cfg['seed']}, top_k {cfg['top_k']}, "
        f"mean prompt {stream['mean_prompt_tokens']:.0f} tokens, {cfg['concurrency']} concurrent clients, "
        f"max_tokens {cfg['max_tokens']}; oracle token hit rate {100 * stream['oracle_token_hit_rate']:.1f}%.\n\n"
        f"{results_table(results)}\n\n![hit rate and TTFT]({path.with_suffix('.png').name})\n"
    )
    path.write_text(text)
