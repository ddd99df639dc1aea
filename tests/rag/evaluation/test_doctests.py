"""The runnable examples in rag.evaluation's docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

DOCTESTED = ["eval_set", "evaluate", "metrics"]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    module = importlib.import_module(f"rag.evaluation.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
