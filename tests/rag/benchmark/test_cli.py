"""The `bench` command's options and the runnable examples in rag.benchmark's docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest
import typer
from typer.testing import CliRunner

from rag.benchmark.cli import bench_config, parse_skews
from rag.benchmark.config import FULL_RUN, BenchConfig
from rag.cli import app

DOCTESTED = [
    "oracle",
    "stats",
    "workload",
    "simulate",
    "measure",
    "results",
    "cli",
    "config",
    "weights_report",
    "retrieval_report",
    "retrieval_scale",
]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    module = importlib.import_module(f"rag.benchmark.{name}")
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


def test_bench_help_lists_the_options():
    result = CliRunner().invoke(app, ["bench", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--quick", "--out", "--requests", "--skew", "--skews", "--seed", "--tenants", "--turns"):
        assert option in result.output


@pytest.mark.parametrize("bad", ["", "a,b", "1,-1"])
def test_parse_skews_rejects(bad):
    with pytest.raises(typer.BadParameter):
        parse_skews(bad)


def test_quick_is_smaller_than_the_default():
    quick, full = BenchConfig.quick_run(), BenchConfig()
    assert quick.quick and not full.quick
    assert quick.requests < full.requests and len(quick.measured) < len(full.measured)
    assert BenchConfig.quick_run(requests=10).requests == 10


def test_full_widens_the_quality_comparison_and_other_flags_still_win():
    default = bench_config(False, {})
    wide = bench_config(False, {"full": True, "quality_questions": 30, "requests": 10})
    assert wide.quality_questions == 30 and wide.requests == 10
    assert wide.quality_matrix_questions == FULL_RUN["quality_matrix_questions"]
    assert wide.quality_budgets == wide.chunks_budgets == (0.1, 0.2, 0.3)
    assert default.quality_questions < FULL_RUN["quality_questions"]
    assert len(default.quality_budgets) == len(default.chunks_budgets) == 1
    assert wide.quality_every_strategy and not default.quality_every_strategy
    assert set(FULL_RUN) <= set(BenchConfig.model_fields)


@pytest.mark.parametrize(
    "bad",
    [
        {"measured": (("cache", 0.0, "lru"),)},
        {"measured": ()},
        {"capacities": (1.5,)},
        {"orders": ("random",)},
    ],
)
def test_config_rejects(bad):
    with pytest.raises(ValueError):
        BenchConfig(**bad)
