"""Small statistics the report needs: summaries (mean, p50, p95) and the TTFT line fit.

Example:
    >>> summarize([1.0, 2.0, 3.0, 4.0])["p50"]
    2.5
    >>> fit = fit_line([0, 100, 200], [0.1, 0.35, 0.6])
    >>> round(fit.a, 3), round(fit.b * 1000, 3), round(fit.r2, 3)
    (0.1, 2.5, 1.0)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]; NaN for no values.

    >>> percentile([1, 2, 3, 4, 5], 95)
    4.8
    """
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, mean, p50, p95, min and max of ``values`` (NaN when empty)."""
    if not values:
        return {"n": 0, "mean": math.nan, "p50": math.nan, "p95": math.nan, "min": math.nan, "max": math.nan}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "min": min(values),
        "max": max(values),
    }


@dataclass(frozen=True)
class LineFit:
    """Least-squares ``y = a + b x`` with its coefficient of determination and sample count."""

    a: float
    b: float
    r2: float
    n: int

    def __call__(self, x: float) -> float:
        return self.a + self.b * x

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def fit_line(x: Sequence[float], y: Sequence[float]) -> LineFit:
    """Ordinary least squares of ``y`` on ``x``; ValueError for fewer than two distinct x values."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    n = len(x)
    mx, my = (statistics.fmean(x), statistics.fmean(y)) if n else (0.0, 0.0)
    sxx = sum((xi - mx) ** 2 for xi in x)
    if n < 2 or sxx == 0:
        raise ValueError(f"fit_line needs at least two distinct x values, got {sorted(set(x))[:3]}")
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sxx
    a = my - b * mx
    ss_tot = sum((yi - my) ** 2 for yi in y)
    ss_res = sum((yi - a - b * xi) ** 2 for xi, yi in zip(x, y))
    return LineFit(a, b, 1.0 - ss_res / ss_tot if ss_tot else 1.0, n)


class TokenCounts:
    """Per-request ``prompt_tokens`` and ``cached_tokens`` lists (a dataclass supplies them) and the
    figures derived from them, shared by measured and simulated runs."""

    prompt_tokens: list[int]
    cached_tokens: list[int]

    @property
    def uncached_tokens(self) -> list[int]:
        return [p - c for p, c in zip(self.prompt_tokens, self.cached_tokens)]

    @property
    def token_hit_rate(self) -> float:
        return sum(self.cached_tokens) / max(sum(self.prompt_tokens), 1)
