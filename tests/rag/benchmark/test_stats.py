"""Summaries and the TTFT line fit."""

from __future__ import annotations

import math

import pytest

from rag.benchmark.measure import sample_indices
from rag.benchmark.results import throughput
from rag.benchmark.stats import fit_line, percentile, summarize


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4, 5], 50, 3),
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4, 5], 95, 4.8),
        ([7], 95, 7),
        ([3, 1, 2], 0, 1),
    ],
)
def test_percentile(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_summarize_empty_is_nan():
    s = summarize([])
    assert s["n"] == 0 and math.isnan(s["mean"]) and math.isnan(s["p95"])


@pytest.mark.parametrize(("a", "b"), [(0.1, 0.0025), (0.0, 1.0), (-2.0, 0.5)])
def test_fit_recovers_a_line(a, b):
    xs = [0, 30, 300, 900, 1600]
    fit = fit_line(xs, [a + b * x for x in xs])
    assert (fit.a, fit.b, fit.r2, fit.n) == (pytest.approx(a), pytest.approx(b), pytest.approx(1.0), 5)
    assert fit(100) == pytest.approx(a + 100 * b)


def test_fit_with_noise_and_errors():
    fit = fit_line([0, 1, 2, 3], [0.0, 1.1, 1.9, 3.0])
    assert 0.9 < fit.b < 1.1 and 0.95 < fit.r2 < 1.0
    with pytest.raises(ValueError):
        fit_line([1, 1], [2, 3])
    with pytest.raises(ValueError):
        fit_line([1, 2], [2])


@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [(10, 4, [0, 3, 6, 9]), (3, 5, [0, 1, 2]), (7, 1, [0]), (5, 0, []), (100, 2, [0, 99])],
)
def test_sample_indices(n, k, expected):
    assert sample_indices(n, k) == expected


def test_throughput():
    assert throughput(1.0, 0.1, 11) == pytest.approx(5.5)
    assert throughput(2.0, 0.0, 1) == pytest.approx(0.5)
