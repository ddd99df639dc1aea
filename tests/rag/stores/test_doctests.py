"""The runnable examples in rag.stores' docstrings (and rag.query's, rag.config's store URL rules)."""

from __future__ import annotations

import doctest
import importlib

import pytest

DOCTESTED = [
    "rag.stores.compat",
    "rag.stores.collection",
    "rag.stores.local.store",
    "rag.stores.postgres.store",
    "rag.query",
    "rag.config",
]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
