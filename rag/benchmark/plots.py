"""The report's figures, drawn with matplotlib's Agg backend from the results dict only.

Filled markers are measured on this machine; hollow markers and lines are simulated hit rates with
TTFT modelled from the measured fit, and every legend says which.

Example:
    >>> paths = draw_all(results, Path("docs/benchmarks"))      # doctest: +SKIP
    >>> sorted(p.name for p in paths)                           # doctest: +SKIP
    ['engine_cold_warm.png', 'hit_rate_vs_skew.png', 'hit_rate_vs_ttft.png', ...]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from rag.benchmark.chunks_plot import chunk_frontier

ORDER_COLORS = {"relevance": "#d62728", "canonical": "#ff7f0e", "cache": "#1f77b4"}
EVICTION_STYLES = {"lru": ("o", "-"), "gdsf": ("s", "--")}
BASELINE_COLORS = {
    "caching off": "#444444",
    "transformers generate": "#9467bd",
    "llama.cpp prompt cache": "#2ca02c",
}

PLOTS = {
    "hit_rate_vs_ttft.png": "Mean TTFT against token hit rate",
    "ttft_vs_capacity.png": "Hit rate and TTFT against cache capacity, per chunk order and eviction policy",
    "ttft_distribution.png": "TTFT distribution with and without the cache (measured)",
    "hit_rate_vs_skew.png": "Token hit rate against popularity skew",
    "engine_cold_warm.png": "Engine: cold vs warm TTFT and decode speed",
    "chunk_frontier.png": "Chunk reuse: recompute budget vs TTFT speedup vs fidelity to full prefill",
}


def _rows(results: dict[str, Any], skew: float) -> list[dict[str, Any]]:
    return [r for r in results["sweep"] if r["skew"] == skew]


def _measured_engine(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(n, m) for n, m in results["measured"].items() if m["kind"] == "engine"]


def _baselines(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(n, m) for n, m in results["measured"].items() if m["kind"] != "engine"]


def hit_rate_vs_ttft(results: dict[str, Any]) -> Figure:
    skew = results["config"]["skew"]
    fig, ax = plt.subplots(figsize=(8, 5.2))
    for r in _rows(results, skew):
        marker, _ = EVICTION_STYLES[r["eviction"]]
        ax.scatter(
            100 * r["token_hit_rate"],
            r["ttft_mean_s"],
            marker=marker,
            s=40,
            facecolors="none",
            edgecolors=ORDER_COLORS[r["order"]],
            linewidths=1.2,
        )
    for name, m in _measured_engine(results):
        ax.scatter(
            100 * m["token_hit_rate"],
            m["ttft_s"]["mean"],
            s=90,
            color=ORDER_COLORS[m["order"]],
            edgecolors="black",
            zorder=3,
        )
        ax.annotate(
            name,
            (100 * m["token_hit_rate"], m["ttft_s"]["mean"]),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
        )
    for k, (name, m) in enumerate(_baselines(results)):
        ax.annotate(
            f"{name}: {m['ttft_s']['mean']:.2f} s ({m['requests']} requests)",
            (0, m["ttft_s"]["mean"]),
            textcoords="offset points",
            xytext=(10, 8 - 16 * k),
            fontsize=8,
        )
        ax.scatter(
            0,
            m["ttft_s"]["mean"],
            s=90,
            marker="D",
            color=BASELINE_COLORS.get(name, "grey"),
            edgecolors="black",
            zorder=3,
            label=f"{name} (measured on {m['requests']} of the requests)",
        )
    fit, prompt = results["fit"], results["workload"]["prompt_tokens_mean"]
    hs = [h / 100 for h in range(0, 101)]
    ax.plot(
        [100 * h for h in hs],
        [fit["a"] + fit["b"] * (1 - h) * prompt for h in hs],
        color="grey",
        lw=1,
        ls=":",
        label=f"fit: a + b x (1 - hit) x {prompt:.0f} tokens",
    )
    for order, color in ORDER_COLORS.items():
        ax.scatter([], [], marker="o", facecolors="none", edgecolors=color, label=f"{order} order (modelled)")
    ax.scatter([], [], s=90, color="white", edgecolors="black", label="engine configs (measured)")
    ax.set_xlabel("token hit rate (% of prompt tokens reused from the cache)")
    ax.set_ylabel("mean time to first token (s)")
    ax.set_title(f"Hit rate turns into TTFT (skew {skew:g}, {results['config']['requests']} requests)")
    ax.set_xlim(-3, 100)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return fig


def ttft_vs_capacity(results: dict[str, Any]) -> Figure:
    skew = results["config"]["skew"]
    rows = _rows(results, skew)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for order, color in ORDER_COLORS.items():
        for eviction, (marker, style) in EVICTION_STYLES.items():
            rs = sorted(
                (r for r in rows if r["order"] == order and r["eviction"] == eviction),
                key=lambda r: r["capacity_share"],
            )
            if not rs:
                continue
            xs = [100 * r["capacity_share"] for r in rs]
            label = f"{order} / {eviction}"
            left.plot(
                xs,
                [100 * r["token_hit_rate"] for r in rs],
                marker=marker,
                ls=style,
                color=color,
                mfc="none",
                label=label,
            )
            right.plot(
                xs,
                [r["ttft_mean_s"] for r in rs],
                marker=marker,
                ls=style,
                color=color,
                mfc="none",
                label=f"{label} (modelled)",
            )
        oracle = [r for r in rows if r["order"] == order and r["capacity_share"] == 1.0]
        if oracle:
            left.axhline(100 * oracle[0]["oracle_hit_rate"], color=color, lw=0.8, ls=":")
    left.plot([], [], color="grey", ls=":", lw=0.8, label="oracle (unbounded cache), per order")
    for name, m in _measured_engine(results):
        right.scatter(
            100 * m["capacity_share"],
            m["ttft_s"]["mean"],
            s=90,
            color=ORDER_COLORS[m["order"]],
            edgecolors="black",
            zorder=3,
            label=f"{name} (measured on {m['requests']} of the requests)",
        )
    for name, m in _baselines(results):
        right.axhline(
            m["ttft_s"]["mean"],
            color=BASELINE_COLORS.get(name, "grey"),
            lw=1.2,
            ls="-.",
            label=f"{name} (measured mean)",
        )
    ws = results["workload"]["working_set_mib"][str(skew)]
    for ax in (left, right):
        ax.set_xlabel(f"cache capacity (% of the working set, 100% = {ws:,.0f} MiB)")
        ax.grid(alpha=0.3)
    left.set_ylabel("token hit rate (%, simulated exactly)")
    right.set_ylabel("mean time to first token (s)")
    right.set_ylim(bottom=0)
    left.set_title("Token hit rate vs capacity")
    right.set_title("TTFT vs capacity")
    left.legend(fontsize=7)
    right.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Capacity sweep (skew {skew:g}, {results['config']['requests']} requests)")
    fig.tight_layout()
    return fig


def ttft_distribution(results: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, samples in results["ttft_samples"].items():
        xs = sorted(samples)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        m = results["measured"][name]
        color = ORDER_COLORS.get(m.get("order", ""), BASELINE_COLORS.get(name, "grey"))
        style = "-" if m["kind"] == "engine" else "--"
        if m["kind"] == "engine" and m["capacity_share"] < 1.0:
            style = ":"
        ax.step(xs, ys, where="post", color=color, ls=style, lw=1.6, label=f"{name} (n={len(xs)})")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("share of requests with TTFT <= x")
    ax.set_title("Measured TTFT distribution (empirical CDF)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def hit_rate_vs_skew(results: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 5))
    skews = sorted({r["skew"] for r in results["sweep"]})
    shares = sorted({r["capacity_share"] for r in results["sweep"] if r["capacity_share"] > 0})
    show = [s for s in (0.25, 1.0) if s in shares] or shares[-1:]
    for order, color in ORDER_COLORS.items():
        for share, style in zip(show, ("--", "-")):
            pts = [
                next(
                    (
                        r
                        for r in results["sweep"]
                        if r["skew"] == s
                        and r["order"] == order
                        and r["eviction"] == "lru"
                        and r["capacity_share"] == share
                    ),
                    None,
                )
                for s in skews
            ]
            pts_ok = [(s, r) for s, r in zip(skews, pts) if r is not None]
            if pts_ok:
                ax.plot(
                    [s for s, _ in pts_ok],
                    [100 * r["token_hit_rate"] for _, r in pts_ok],
                    marker="o",
                    ls=style,
                    color=color,
                    label=f"{order}, {share:.0%} capacity, lru",
                )
    ax.set_xlabel("Zipf skew of topic popularity (0 = uniform)")
    ax.set_ylabel("token hit rate (%, simulated exactly)")
    ax.set_title(f"Hit rate vs popularity skew ({results['config']['requests']} requests per stream)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def engine_cold_warm(results: dict[str, Any]) -> Figure:
    eng = results.get("engine_section") or {}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    ttft = eng.get("ttft", {})
    if ttft:
        labels = ["caching off\n(cold)", "cache on,\n0% hits", "prefix cached\n(warm)"]
        values = [ttft["cold_s"], ttft["cache_zero_hit_s"], ttft["warm_s"]]
        bars = left.bar(labels, values, color=["#444444", "#888888", "#1f77b4"])
        left.bar_label(bars, labels=[f"{v:.2f} s" for v in values])
        left.set_ylabel("median time to first token (s)")
        left.set_title(
            f"{eng.get('prompt_tokens', '?')}-token prompt, {eng.get('warm_cached_tokens', '?')} cached when warm"
        )
    dec = eng.get("decode", {})
    if dec:
        labels = ["prefixrag engine", "transformers\ngenerate"]
        values = [dec["ours_ms_per_token"], dec["transformers_generate_ms_per_token"]]
        bars = right.bar(labels, values, color=["#1f77b4", "#9467bd"])
        right.bar_label(bars, labels=[f"{v:.0f} ms" for v in values])
        right.set_ylabel("decode time per output token (ms, median)")
        right.set_title(f"Decode at the same context, median of {dec.get('runs', '?')} runs")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Engine: TTFT cold, at 0% hits and warm; decode ms/token")
    fig.tight_layout()
    return fig


DRAWERS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "hit_rate_vs_ttft.png": hit_rate_vs_ttft,
    "ttft_vs_capacity.png": ttft_vs_capacity,
    "ttft_distribution.png": ttft_distribution,
    "hit_rate_vs_skew.png": hit_rate_vs_skew,
    "engine_cold_warm.png": engine_cold_warm,
    "chunk_frontier.png": chunk_frontier,
}
SECTION_OF = {"engine_cold_warm.png": "engine_section", "chunk_frontier.png": "chunks_section"}


def draw_all(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every figure that has data into ``out_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in DRAWERS.items():
        if name in SECTION_OF and not results.get(SECTION_OF[name]):
            continue
        fig = draw(results)
        path = out_dir / name
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
