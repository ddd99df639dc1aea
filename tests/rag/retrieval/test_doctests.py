"""The runnable examples in rag.retrieval's docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

DOCTESTED = ["bm25", "diversity"]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    module = importlib.import_module(f"rag.retrieval.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
