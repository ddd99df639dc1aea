"""The chunks section's figure: recompute budget vs TTFT speedup vs fidelity (the frontier).

Left: mean KL to full prefill against the recompute budget, one line per selection strategy, the naive
stitch (no recompute) as the floor line. Right: the same settings by measured TTFT speedup over
caching off, with exact prefix mode (KL 0 by construction) as a vertical line and the target
region shaded.

Example:
    >>> fig = chunk_frontier(results)        # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

STRATEGY_COLORS = {"first_tail": "#2ca02c", "first": "#ff7f0e", "deviation": "#1f77b4"}
NAIVE_COLOR = "#d62728"
KL_TARGET, SPEEDUP_TARGET = 0.03, 5.0


def chunk_frontier(results: dict[str, Any]) -> Figure:
    s = results["chunks_section"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    naive, naive_speedup = _kl(s, "none"), _speedup(s, "none")
    for strategy, color in STRATEGY_COLORS.items():
        points = _points(s, strategy)
        if not points:
            continue
        if naive is not None:  # every curve starts at the naive stitch: budget 0
            points = [(0.0, naive_speedup, naive), *points]
        budgets, speedups, kls = zip(*points, strict=True)
        left.plot([100 * b for b in budgets], kls, marker="o", color=color, label=strategy)
        right.plot(speedups, kls, marker="o", color=color, label=strategy)
        for b, x, y in points[1:]:
            right.annotate(f"{b:.0%}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if naive is not None:
        left.axhline(naive, color=NAIVE_COLOR, ls="--", label="naive stitch (no recompute)")
        right.scatter([naive_speedup], [naive], color=NAIVE_COLOR, marker="s", label="naive stitch", zorder=3)
    left.axhline(KL_TARGET, color="gray", ls=":", label=f"target KL {KL_TARGET}")
    exact = s["ttft"].get("exact prefix", {}).get("speedup_vs_off_mean")
    if exact is not None:
        right.axvline(exact, color="#2ca02c", ls="--", label=f"exact prefix mode (KL 0), {exact:.1f}x")
    for ax in (left, right):
        ax.set_yscale("log")
    low, high = right.get_ylim()
    right.set_ylim(low, max(high, 1.5 * KL_TARGET))
    right.fill_between(
        [SPEEDUP_TARGET, max(SPEEDUP_TARGET, right.get_xlim()[1])],
        low,
        KL_TARGET,
        color="gray",
        alpha=0.15,
        label="targets: >= 5x, KL <= 0.03",
    )
    left.set_xlim(left=-1)
    left.set_xlabel("recompute budget (% of reused chunk tokens)")
    left.set_ylabel(f"mean KL to full prefill, first {s['kl_positions']} answer positions (nats)")
    left.set_title("Fidelity vs recompute budget")
    right.set_xlabel("mean TTFT speedup over caching off (measured, after warming)")
    right.set_ylabel("mean KL (nats)")
    right.set_title("Frontier: speed vs fidelity")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"Chunk reuse beyond the prefix, {s['fidelity_prompts']} stream prompts")
    fig.tight_layout()
    return fig


def _points(s: dict[str, Any], strategy: str) -> list[tuple[float, float, float]]:
    out = []
    for m in s["ttft"].values():
        if m.get("kind") != "chunks warm" or m.get("strategy") != strategy:
            continue
        kl = _kl(s, m["setting"])
        if kl is not None:
            out.append((float(m["share"]), float(m["speedup_vs_off_mean"]), kl))
    return sorted(out)


def _kl(s: dict[str, Any], label: str) -> float | None:
    value = s["fidelity"].get(label, {}).get("kl_mean")
    return None if value is None or math.isnan(value) else max(float(value), 1e-6)


def _speedup(s: dict[str, Any], label: str) -> float:
    return float(s["ttft"][f"chunks warm, {label}"]["speedup_vs_off_mean"])
