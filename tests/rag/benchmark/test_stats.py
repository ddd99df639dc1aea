"""Summaries, the TTFT line fit, and how requests are shared and ordered between configurations."""

from __future__ import annotations

import math

import pytest

from rag.benchmark.measure import Measurement, rotated, sample_indices, sampled_requests
from rag.benchmark.results import paired_speedup, throughput
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


@pytest.mark.parametrize(("n", "off", "hf"), [(96, 12, 6), (16, 3, 2), (6, 2, 1), (10, 4, 9)])
def test_the_baselines_run_on_requests_every_configuration_shares(n, off, hf):
    off_at, hf_at = sampled_requests(n, off, hf)
    assert len(off_at) == min(n, off) and hf_at <= off_at and len(hf_at) == min(hf, len(off_at))
    assert {0, n - 1} <= off_at  # spread over the whole stream


def test_every_turn_takes_every_place_over_the_rounds():
    turns = ["engine-a", "engine-b", "caching off", "transformers"]
    firsts = [rotated(turns, i)[0] for i in range(8)]
    assert sorted(firsts) == sorted(turns * 2)
    assert rotated([], 3) == [] and rotated(turns, 0) == turns


def test_paired_speedup_compares_the_same_requests():
    on = Measurement("on", "engine", indices=[0, 1, 2, 3], ttft_s=[2.0, 0.1, 0.1, 1.0])
    off = Measurement("off", "engine-off", indices=[0, 3], ttft_s=[3.0, 3.0])
    paired = paired_speedup(on, off)
    assert paired["requests"] == 2 and paired["ttft_s"]["mean"] == pytest.approx(1.5)
    assert paired["speedup_mean"] == pytest.approx(2.0)  # not 3.0 / 0.8, the whole stream's mean
    assert math.isnan(
        paired_speedup(on, Measurement("x", "engine-off", indices=[7], ttft_s=[1.0]))["speedup_mean"]
    )
